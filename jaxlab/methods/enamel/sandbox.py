"""Runs untrusted candidate programs in a separate, resource-limited process and times their calls.

ENAMEL scores LLM-written Python functions by correctness and speed, so every candidate must be
executed, timed over many inputs and its outputs handed to a trusted checker. The official
harness runs candidates in the evaluator's own process under `setitimer` signals, which a
`while True: try: ... except: pass` loop survives, and whose outputs are live objects that can
carry a lying `__eq__`. Here:

* **One worker process per program.** `run_cases` starts a small *launcher* (`python -I`, its own
  session) that forks the *worker*. The worker isolates itself, loads the program once and then
  answers one test case at a time over two pipes. The launcher stays behind as the worker's
  parent: it is what `os.kill(os.getppid(), ...)` hits, it reaps and kills every descendant the
  program leaves behind (it is a child subreaper), and it reports how the worker ended.
* **Limits set before any candidate code runs:** address space (MemoryError -> "memory"), CPU
  seconds (a backstop: cumulative over all the program's cases), file size, process count, no
  core files; a fresh empty working directory; stdin, stdout and stderr on /dev/null (printing
  gigabytes costs nothing and blocks nobody); every other inherited file descriptor closed.
* **Deadlines in the parent.** Each case gets `repeats * (time_limit + tolerance) + 1 s` of wall
  clock; past it the worker's process group is SIGKILLed (a signal nobody can catch), the case is
  a "timeout" and the program's later cases are "not_run". The worker itself times every call with
  a `time.perf_counter` captured before the program was executed, and stops at the first call
  slower than the time limit.
* **Nothing executable crosses back.** The parent sends pickles (parent -> worker only: the worker
  trusts the parent). Replies are untrusted bytes: length-prefixed JSON, capped in size, parsed
  with `json.loads` and rebuilt by `decode_value` into plain builtin values only. The worker
  encodes outputs with `encode_value`, which admits exact builtin types only (`type(x) is int`,
  not `isinstance`), so a subclass or custom class with a lying `__eq__`, or a generator, is
  "unencodable" (a wrong answer). The checker runs in the parent, whose builtins the program
  cannot touch.

What is guaranteed and what is best-effort:

* Always: the evaluator does not execute, unpickle or import anything the program produced; it
  survives any crash, exit, hang, fork bomb, memory bomb or output flood of the program; a
  timed-out or crashed worker and the process group it leads are killed with SIGKILL.
* When the evaluator runs as root (e.g. in a container), the worker additionally drops to a
  unique unprivileged uid/gid (2130706432 + the launcher's pid, so concurrent workers cannot
  signal one another and RLIMIT_NPROC bounds exactly this program's processes; `nobody` where
  such a uid is not mapped; the worker refuses to run a program as root), sets no_new_privs, and
  enters new network, mount and IPC namespaces: no network at all (not even loopback), and small
  private tmpfs mounts on its working directory, /tmp, /var/tmp and /dev/shm (so it can neither
  fill the disk nor see the evaluator's temporary files). It can then neither signal, trace nor
  write to anything the evaluator owns. The interpreter may live under a directory the worker
  can no longer enter (/root/.pyenv, say), so `sys.path` entries are re-pointed at directory
  descriptors opened before the drop (/proc/self/fd/N); imports keep working.
* Without root, the worker tries user namespaces (network, mount and IPC isolation as above) and
  otherwise falls back to replacing `socket.socket` and friends with functions that raise, which
  a determined program can bypass (`_socket`, ctypes). It runs as the evaluator's own user, so a
  hostile program can in principle still signal or overwrite anything that user owns: the
  launcher absorbs `os.kill(os.getppid(), ...)` (a dead launcher is noticed and the case fails),
  but full isolation needs a separate user or container.
* Timing and protocol messages come from the process that runs the candidate, so a program that
  deliberately tampers with the worker's own code or writes forged replies to its pipe can lie
  about its speed; it cannot harm the evaluator by doing so (malformed replies are an "error").

The worker-side code lives between the two "sandbox worker section" markers below: the launcher
executes only that part of this file, so a worker starts in tens of milliseconds without importing
`dataclasses`, `subprocess` and the rest of the parent side.
"""
from __future__ import annotations

# ---- sandbox worker section begins ----
# Everything from here to the end marker also runs inside the sandbox (see the module docstring):
# standard library only, nothing slow to import, and no names defined after the end marker.
import builtins
import ctypes
import json
import math
import os
import pickle
import resource
import signal
import sys
import time

# Tags of the JSON encoding: a JSON object always has exactly one of these keys.
_TUPLE, _DICT, _SET, _FROZENSET, _BYTES, _BIG_INT, _FLOAT, _COMPLEX = (
    "t", "d", "s", "fs", "b", "i", "f", "c")
# Ints inside this bound travel as JSON numbers; larger ones as hex strings (no digit limits).
_INT_BOUND = 2**63
_MAX_DEPTH = 100
_NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
_HEADER_BYTES = 4

# Captured before any candidate code runs: a program that rebinds `builtins.type` or `len` must
# not change how the worker times or encodes it.
_type = type
_bool, _int, _float, _complex, _str, _bytes = bool, int, float, complex, str, bytes
_list, _tuple, _dict, _set, _frozenset = list, tuple, dict, set, frozenset
_callable = callable
_len = len
_min = min
_max = max
_all = all
_map = map
_isfinite = math.isfinite
_range = range
_memoryview = memoryview
_BaseException = BaseException
_Exception = Exception
_MemoryError = MemoryError
_SystemExit = SystemExit
_int_format = int.__format__
_bytes_hex = bytes.hex
_dict_items = dict.items
_str_encode = str.encode
_int_from_bytes = int.from_bytes
_int_to_bytes = int.to_bytes
_clock = time.perf_counter
_loads = pickle.loads
_join = "".join


def _make_json_dumps():
  """Compact JSON text without NaN; the C encoder when there is one, since json.JSONEncoder's
  Python layer calls `isinstance`, which a program may have rebound."""
  from json import encoder  # pylint: disable=g-import-not-at-top
  if encoder.c_make_encoder is None or encoder.c_encode_basestring_ascii is None:
    return json.JSONEncoder(allow_nan=False, check_circular=False, separators=(",", ":")).encode

  def refuse(value):
    raise TypeError("not JSON")

  iterate = encoder.c_make_encoder(None, refuse, encoder.c_encode_basestring_ascii, None, ":",
                                   ",", False, False, False)
  return lambda value: _join(iterate(value, 0))


_json_dumps = _make_json_dumps()
_os_read = os.read
_os_write = os.write
_os_exit = os._exit
_getpid = os.getpid
_INF = float("inf")

# Linux constants (<sched.h>, <sys/mount.h>, <sys/prctl.h>).
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWNET = (
    0x00020000, 0x08000000, 0x10000000, 0x40000000)
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 36, 38
_NOBODY = 65534
_SANDBOX_UID_BASE = 0x7F000000
_SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
_SCRATCH_INODES = 1024
_MAX_OPEN_FILES = 1024
_DETAIL_CHARS = 300


class UnencodableError(TypeError):
  """The value is not built from exact builtin types only."""


def _to_tagged(value, depth=0):
  """A JSON-ready form of `value`; see `encode_value`."""
  kind = _type(value)
  if value is None or kind is _bool or kind is _str:
    return value
  if kind is _int:
    return value if -_INT_BOUND < value < _INT_BOUND else {_BIG_INT: _int_format(value, "x")}
  if kind is _float:
    if value != value:
      return {_FLOAT: "nan"}
    if value == _INF or value == -_INF:
      return {_FLOAT: "inf" if value > 0 else "-inf"}
    return value
  if depth >= _MAX_DEPTH:
    raise UnencodableError(f"nested deeper than {_MAX_DEPTH} levels (or cyclic)")
  depth += 1
  if kind is _list:
    # Flat lists of one scalar type are most outputs: check them at C speed, copy nothing.
    kinds = _set(_map(_type, value))
    if _len(kinds) == 1:
      (item_kind,) = kinds
      if item_kind is _str or item_kind is _bool or (
          item_kind is _int and -_INT_BOUND < _min(value) and _max(value) < _INT_BOUND) or (
              item_kind is _float and _all(_map(_isfinite, value))):
        return value
    return [_to_tagged(item, depth) for item in value]
  if kind is _tuple:
    return {_TUPLE: [_to_tagged(item, depth) for item in value]}
  if kind is _dict:
    return {_DICT: [[_to_tagged(key, depth), _to_tagged(item, depth)]
                    for key, item in _dict_items(value)]}
  if kind is _set:
    return {_SET: [_to_tagged(item, depth) for item in value]}
  if kind is _frozenset:
    return {_FROZENSET: [_to_tagged(item, depth) for item in value]}
  if kind is _bytes:
    return {_BYTES: _bytes_hex(value)}
  if kind is _complex:
    return {_COMPLEX: [_to_tagged(value.real, depth), _to_tagged(value.imag, depth)]}
  raise UnencodableError(f"a {_type_name(kind)} is not a plain builtin value")


def _type_name(kind) -> str:
  try:
    name = _type.__dict__["__qualname__"].__get__(kind)
  except _Exception:  # pylint: disable=broad-except
    return "value of unknown type"
  return name if _type(name) is _str else "value of unknown type"


def _libc():
  return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> bool:
  return _libc().prctl(option, value, 0, 0, 0) == 0


def _id_is_mapped(identifier: int, map_file: str) -> bool:
  """Whether `identifier` exists in this user namespace (setuid to an unmapped id fails)."""
  try:
    with open(map_file, encoding="ascii") as lines:
      ranges = [tuple(int(field) for field in line.split()) for line in lines]
  except (OSError, ValueError):
    return identifier == _NOBODY
  return any(inside <= identifier < inside + count for inside, _, count in ranges)


def _sandbox_ids() -> tuple[int, int]:
  """A uid/gid of our own (no other process has it), else nobody's."""
  unique = _SANDBOX_UID_BASE + os.getpid()
  for candidate in (unique, _NOBODY):
    if (_id_is_mapped(candidate, "/proc/self/uid_map") and
        _id_is_mapped(candidate, "/proc/self/gid_map")):
      return candidate, candidate
  raise OSError("no unprivileged uid is mapped in this user namespace")


def _unshare(is_root: bool) -> list[str]:
  """Enters new network/mount/IPC namespaces (through a user namespace when not root)."""
  libc = _libc()
  isolated = ["net", "mount", "ipc"]
  flags = _CLONE_NEWNET | _CLONE_NEWNS | _CLONE_NEWIPC
  if is_root:
    if libc.unshare(flags) == 0:
      return isolated
    return ["net"] if libc.unshare(_CLONE_NEWNET) == 0 else []
  uid, gid = os.getuid(), os.getgid()
  if libc.unshare(_CLONE_NEWUSER | flags) != 0:
    return []
  try:
    # Map our own ids only; "deny" first is what the kernel asks of an unprivileged mapper.
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
      with open(path, "w", encoding="ascii") as handle:
        handle.write(text)
  except OSError:
    return ["net", "ipc", "user"]  # unshared all the same; mounts need the mapping
  return isolated + ["user"]


def _mount_tmpfs(path: str, size_bytes: int, mode: str, uid: int, gid: int) -> None:
  options = f"size={max(size_bytes // 1024, 64)}k,nr_inodes={_SCRATCH_INODES},mode={mode}"
  options += f",uid={uid},gid={gid}"
  if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                   options.encode()) != 0:
    raise OSError(ctypes.get_errno(), f"mounting a tmpfs on {path} failed")


def _mount_scratch(workdir: str, size_bytes: int, uid: int, gid: int) -> None:
  """Small private tmpfs mounts on the world-writable directories and on the working directory."""
  libc = _libc()
  # Private propagation first, so that nothing mounted here shows up outside.
  if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
    raise OSError(ctypes.get_errno(), "making the mount namespace private failed")
  for path in _SCRATCH_DIRS:
    if os.path.isdir(path) and not os.path.islink(path):
      # Owned by whoever we are now (root, or our own uid in a user namespace); sticky, 1777.
      _mount_tmpfs(path, size_bytes, "1777", os.geteuid(), os.getegid())
  # The parent's directory may now be hidden under a fresh /tmp: recreate the path there.
  os.makedirs(workdir, mode=0o700, exist_ok=True)
  _mount_tmpfs(workdir, size_bytes, "0700", uid, gid)


def _set_limits(config: dict) -> None:
  limits = (
      (resource.RLIMIT_AS, config["memory_bytes"]),
      (resource.RLIMIT_CPU, config["cpu_seconds"]),
      (resource.RLIMIT_FSIZE, config["file_bytes"]),
      (resource.RLIMIT_NPROC, config["max_processes"]),
      (resource.RLIMIT_CORE, 0),
      (resource.RLIMIT_NOFILE, _MAX_OPEN_FILES),
  )
  for which, value in limits:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
      value = min(value, hard)
    # CPU: SIGXCPU at the soft limit, SIGKILL a second later if that is caught.
    new_hard = value + 1 if which == resource.RLIMIT_CPU else value
    if hard != resource.RLIM_INFINITY:
      new_hard = min(new_hard, hard)
    resource.setrlimit(which, (value, new_hard))


def _quiet_and_close_fds(keep: tuple[int, ...]) -> None:
  """stdin/stdout/stderr -> /dev/null; every other descriptor but `keep` closed."""
  null = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1, 2):
    if fd != null:
      os.dup2(null, fd)
  low = 3
  for fd in sorted(keep) + [2**30]:
    if fd > low:
      os.closerange(low, fd)
    low = max(low, fd + 1)


def _reachable_sys_path() -> list[int]:
  """Re-points `sys.path` at descriptors of its directories, opened while still privileged.

  After the uid drop the interpreter's own directories may be unreachable (e.g. under a 0700
  /root); /proc/self/fd/N reaches an open directory without walking its ancestors.
  """
  fds, entries, renamed = [], [], {}
  for entry in sys.path:
    try:
      fd = os.open(entry or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
      continue  # a missing zip or directory: nothing to import from it anyway
    fds.append(fd)
    entries.append(f"/proc/self/fd/{fd}")
    renamed[os.path.abspath(entry)] = entries[-1]
  sys.path[:] = entries
  # Packages imported already (collections, encodings, json, ...) find their submodules through
  # their own __path__, which names the old location.
  for module in list(sys.modules.values()):
    search = getattr(module, "__path__", None)
    if type(search) is not list:
      continue
    for index, location in enumerate(search):
      for old, new in renamed.items():
        if location.startswith(old + os.sep):
          search[index] = new + location[len(old):]
          break
  sys.path_importer_cache.clear()
  return fds


def _drop_privileges(uid: int, gid: int) -> None:
  os.setgroups([])
  os.setresgid(gid, gid, gid)
  os.setresuid(uid, uid, uid)
  if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or uid == 0:
    raise OSError("could not drop root privileges")


def _drop_capabilities() -> None:
  """Clears the capabilities a user namespace grants (they would let the program remount)."""

  class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

  class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]

  _libc().capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)())


def _block_sockets() -> None:
  """Best-effort fallback when no network namespace is available: `_socket` stays reachable."""
  import _socket  # pylint: disable=g-import-not-at-top
  import socket  # pylint: disable=g-import-not-at-top

  def refuse(*args, **kwargs):
    raise PermissionError("network access is disabled in the sandbox")

  for module in (socket, _socket):
    for name in ("socket", "socketpair", "fromfd", "create_connection", "create_server",
                 "getaddrinfo", "gethostbyname"):
      if hasattr(module, name):
        setattr(module, name, refuse)


def _enter_sandbox(config: dict, keep_fds: tuple[int, ...]) -> dict:
  """Everything that must happen before candidate code runs; returns a description of it."""
  os.setpgid(0, 0)
  _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  is_root = os.geteuid() == 0
  uid, gid = (config["sandbox_uid"], config["sandbox_gid"]) if is_root else (
      os.getuid(), os.getgid())
  namespaces = _unshare(is_root)
  workdir = config["workdir"]
  scratch_bytes = max(16 * config["file_bytes"], 2**20)
  if "mount" in namespaces:
    _mount_scratch(workdir, scratch_bytes, uid, gid)
  elif is_root:
    os.chown(workdir, uid, gid)
  os.chdir(workdir)
  _quiet_and_close_fds(keep_fds)
  path_fds = _reachable_sys_path() if is_root else []
  _set_limits(config)
  if is_root:
    _drop_privileges(uid, gid)
  elif "user" in namespaces:
    _drop_capabilities()
  _prctl(_PR_SET_NO_NEW_PRIVS, 1)
  # Set after the uid change (which clears it): if the launcher dies, so does the worker.
  _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  if "net" not in namespaces:
    _block_sockets()
  # Writing past RLIMIT_FSIZE then fails with EFBIG instead of killing the worker.
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  return {"uid": os.getuid(), "namespaces": namespaces, "sys_path_fds": len(path_fds)}


def _read_exactly(fd: int, count: int):
  parts, remaining = [], count
  while remaining:
    chunk = _os_read(fd, _min(remaining, 1 << 20))
    if not chunk:
      return None
    parts.append(chunk)
    remaining -= _len(chunk)
  return b"".join(parts)


def _read_command(fd: int):
  header = _read_exactly(fd, _HEADER_BYTES)
  if header is None:
    return None
  body = _read_exactly(fd, _int_from_bytes(header, "big"))
  return None if body is None else _loads(body)


def _reply(fd: int, message: dict, max_bytes: int) -> None:
  try:
    data = _str_encode(_json_dumps(message), "ascii")
  except _Exception as error:  # pylint: disable=broad-except
    data = _str_encode(_json_dumps({"status": "unencodable",
                                    "detail": f"{_type_name(_type(error))} while encoding"}),
                       "ascii")
  if _len(data) > max_bytes:
    data = _str_encode(_json_dumps({"status": "error",
                                    "detail": f"reply of {_len(data)} bytes > {max_bytes}"}),
                       "ascii")
  view = _memoryview(_int_to_bytes(_len(data), _HEADER_BYTES, "big") + data)
  while view:
    view = view[_os_write(fd, view):]


def _run_case(function, args_pickle: bytes, repeats: int, time_limit: float) -> dict:
  seconds, output = [], None
  for index in _range(repeats):
    args = _loads(args_pickle)  # a fresh copy per call: the program may mutate its inputs
    try:
      start = _clock()
      result = function(*args)
      elapsed = _clock() - start
    except _SystemExit:
      raise
    except _MemoryError:
      return {"status": "memory", "detail": "MemoryError"}
    except _BaseException as error:  # pylint: disable=broad-except
      # The type name only: str(error) would run the program's code again, unguarded.
      return {"status": "error", "detail": _type_name(_type(error))}
    seconds.append(elapsed)
    if elapsed > time_limit:
      return {"status": "timeout", "seconds": seconds,
              "detail": f"a call took {elapsed:.3f} s > {time_limit:.3f} s"}
    if index == 0:
      try:
        output = _to_tagged(result)
      except UnencodableError as error:
        return {"status": "unencodable", "detail": _str(error)[:_DETAIL_CHARS]}
      except _BaseException as error:  # pylint: disable=broad-except
        return {"status": "unencodable",
                "detail": f"{_type_name(_type(error))} while encoding the output"}
    result = None
  return {"status": "ok", "output": output, "seconds": seconds}


def _load_program(source: str, entry_point: str):
  """(function, None) or (None, failure reply)."""
  namespace = {"__name__": "__candidate__", "__builtins__": builtins}
  try:
    code = compile(source, "<candidate>", "exec")
  except BaseException as error:  # pylint: disable=broad-except
    return None, {"status": "compile_error", "detail": _type_name(_type(error))}
  try:
    exec(code, namespace)  # pylint: disable=exec-used
  except _SystemExit:
    raise
  except _MemoryError:
    return None, {"status": "memory", "detail": "MemoryError while loading the program"}
  except _BaseException as error:  # pylint: disable=broad-except
    return None, {"status": "compile_error",
                  "detail": f"{_type_name(_type(error))} while loading the program"}
  function = namespace.get(entry_point)
  if not _callable(function):
    return None, {"status": "compile_error", "detail": f"no function named {entry_point!r}"}
  return function, None


def _worker_main(config: dict) -> None:
  command_fd, reply_fd = config["command_fd"], config["reply_fd"]
  max_reply = config["reply_bytes"]
  try:
    description = _enter_sandbox(config, (command_fd, reply_fd))
  except BaseException as error:  # pylint: disable=broad-except
    _reply(reply_fd, {"status": "crashed",
                      "detail": f"sandbox setup failed: {error!r}"[:_DETAIL_CHARS]}, max_reply)
    _os_exit(1)
  _reply(reply_fd, {"status": "sandboxed", **description}, max_reply)
  worker_pid = _getpid()
  try:
    source, entry_point = _read_command(command_fd)
    function, failure = _load_program(source, entry_point)
    if failure is not None:
      _reply(reply_fd, failure, max_reply)
      _os_exit(0)
    _reply(reply_fd, {"status": "ready"}, max_reply)
    while True:
      command = _read_command(command_fd)
      if command is None:
        _os_exit(0)  # the parent is done
      reply = _run_case(function, *command)
      if _getpid() != worker_pid:
        _os_exit(0)  # a copy forked by the program returned here; only the worker answers
      _reply(reply_fd, reply, max_reply)
  except _SystemExit:
    if _getpid() == worker_pid:
      _reply(reply_fd, {"status": "crashed", "detail": "the program raised SystemExit"},
             max_reply)
    _os_exit(3)


def _children(pid: int) -> list[int]:
  try:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
      return [int(child) for child in handle.read().split()]
  except FileNotFoundError:  # kernels without CONFIG_PROC_CHILDREN
    children = []
    for entry in os.listdir("/proc"):
      try:
        with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
          fields = handle.read().rsplit(")", 1)[1].split()
      except (OSError, IndexError):
        continue
      if fields and int(fields[1]) == pid:
        children.append(int(entry))
    return children


def _kill_descendants(deadline_s: float) -> None:
  """Kills what the program left behind: as a subreaper, orphans become our children."""
  deadline = time.monotonic() + deadline_s
  while time.monotonic() < deadline:
    children = _children(os.getpid())
    if not children:
      break
    for child in children:
      try:
        os.kill(child, signal.SIGKILL)  # our own unreaped child: its pid cannot be reused
      except OSError:
        pass
    for child in children:
      try:
        os.waitpid(child, 0)
      except ChildProcessError:
        pass
  try:
    while os.waitpid(-1, os.WNOHANG)[0]:
      pass
  except ChildProcessError:
    pass


def _launcher_main(config: dict) -> None:
  def say(line: str) -> None:
    try:
      os.write(1, (line + "\n").encode())
    except OSError:
      pass

  try:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the evaluator died: nobody wants the results
    if os.geteuid() == 0:
      config["sandbox_uid"], config["sandbox_gid"] = _sandbox_ids()
    worker = os.fork()
    if worker == 0:
      try:
        _worker_main(config)
      finally:
        _os_exit(4)
    try:
      os.setpgid(worker, worker)
    except OSError:
      pass  # the worker did it first, or is already gone
    os.close(config["command_fd"])
    os.close(config["reply_fd"])
    say(f"worker {worker}")
    while True:
      reaped, status = os.waitpid(-1, 0)
      if reaped == worker:
        break
    if os.WIFSIGNALED(status):
      say(f"signal {os.WTERMSIG(status)}")
    else:
      say(f"exit {os.waitstatus_to_exitcode(status)}")
    _kill_descendants(config["cleanup_s"])
  except BaseException as error:  # pylint: disable=broad-except
    say(f"fatal {error!r}"[:_DETAIL_CHARS].replace("\n", " "))
    os._exit(1)
  os._exit(0)
# ---- sandbox worker section ends ----

import dataclasses  # pylint: disable=g-import-not-at-top,g-bad-import-order
import marshal  # pylint: disable=g-import-not-at-top,g-bad-import-order
import select  # pylint: disable=g-import-not-at-top,g-bad-import-order
import shutil  # pylint: disable=g-import-not-at-top,g-bad-import-order
import subprocess  # pylint: disable=g-import-not-at-top,g-bad-import-order
import tempfile  # pylint: disable=g-import-not-at-top,g-bad-import-order
from typing import Any, Sequence  # pylint: disable=g-import-not-at-top,g-bad-import-order

STATUSES = ("ok", "error", "timeout", "memory", "crashed", "unencodable", "not_run",
            "compile_error")
# Wall-clock slack per case on top of the calls themselves: unpickling the inputs, encoding the
# output, a busy machine.
_CASE_OVERHEAD_S = 1.0
# How long the launcher may take to clean up after the worker, and to report how it ended.
_CLEANUP_S = 5.0
_REPORT_WAIT_S = 1.0
# After the worker is known to be dead, how long its last words may take to arrive.
_DRAIN_S = 0.1
_LAUNCHER_LINE_BYTES = 4096
# Spelled in two parts so that only the real markers match.
_SECTION_BEGIN = "# ---- sandbox worker section " + "begins ----"
_SECTION_END = "# ---- sandbox worker section " + "ends ----"
# The launcher: run the worker section of this file, which the parent sends compiled (marshal,
# parent -> worker only) as the first frame on the command pipe; that saves compiling it in
# every worker. The first line marks every sandbox process (forks share it) in /proc/*/cmdline.
_BOOTSTRAP = """# jaxlab-enamel-sandbox
import marshal, os, sys
def read(count):
  data = b""
  while len(data) < count:
    chunk = os.read(int(sys.argv[1]), count - len(data))
    if not chunk:
      sys.exit(1)
    data += chunk
  return data
namespace = {"__name__": "jaxlab_enamel_sandbox_worker"}
exec(marshal.loads(read(int.from_bytes(read(4), "big"))), namespace)
namespace["_launcher_main"](namespace["json"].loads(sys.argv[2]))
"""
MARKER = "jaxlab-enamel-sandbox"
_worker_code: bytes | None = None


def _worker_section_code() -> bytes:
  """The worker section of this file, compiled with its line numbers, marshalled (cached)."""
  global _worker_code
  if _worker_code is None:
    path = os.path.abspath(__file__)
    with open(path, encoding="utf-8") as handle:
      source = handle.read()
    start, end = source.index(_SECTION_BEGIN), source.index(_SECTION_END)
    padding = "\n" * source.count("\n", 0, start)
    code = compile("from __future__ import annotations" + padding + source[start:end], path,
                   "exec", dont_inherit=True)
    _worker_code = marshal.dumps(code)
  return _worker_code


@dataclasses.dataclass(frozen=True)
class Limits:
  memory_bytes: int = 4 * 2**30
  cpu_seconds: int = 60              # backstop, cumulative over all cases of one program
  file_bytes: int = 2**20            # largest file the program may write
  max_processes: int = 64            # RLIMIT_NPROC (effective when the worker has its own uid)
  reply_bytes: int = 64 * 2**20      # largest reply (encoded output) accepted from the worker
  tolerance_s: float = 0.01
  startup_s: float = 5.0             # time allowed to start the worker and exec the program


@dataclasses.dataclass
class CaseResult:
  status: str           # one of STATUSES
  output: Any = None    # the decoded plain value when ok
  seconds: list[float] = dataclasses.field(default_factory=list)
  detail: str = ""      # for "error": the exception's type name; otherwise a short explanation


def encode_value(value: Any) -> str:
  """JSON text for a value built from exact builtin types; raises UnencodableError otherwise.

  None, bool, str, ints below 2**63 in magnitude, finite floats and lists are plain JSON; every
  JSON object has one key naming what it holds: {"t": [...]} tuple, {"d": [[key, value], ...]}
  dict, {"s": [...]} set, {"fs": [...]} frozenset, {"b": "<hex>"} bytes, {"i": "<hex>"} big int,
  {"f": "nan" | "inf" | "-inf"} non-finite float, {"c": [real, imag]} complex.
  """
  return _json_dumps(_to_tagged(value))


def decode_value(text: str | bytes) -> Any:
  """The value `encode_value` encoded; ValueError on anything else (the text is untrusted)."""
  try:
    return _from_tagged(json.loads(text, parse_constant=_reject_constant))
  except (TypeError, KeyError, RecursionError, OverflowError) as error:
    raise ValueError(f"malformed value: {error!r}"[:_DETAIL_CHARS]) from None


_PLAIN_JSON = frozenset({type(None), bool, int, float, str})


def _reject_constant(name: str) -> None:
  raise ValueError(f"bare {name} is not part of the encoding")


def _from_tagged(node: Any, depth: int = 0) -> Any:
  kind = type(node)
  if node is None or kind in (bool, str, int, float):
    return node
  if depth >= _MAX_DEPTH:
    raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
  depth += 1
  if kind is list:
    if set(map(type, node)) <= _PLAIN_JSON:
      return node  # a fresh list from json.loads with nothing to rebuild
    return [_from_tagged(item, depth) for item in node]
  if kind is not dict or len(node) != 1:
    raise ValueError("a JSON object must have exactly one tag")
  (tag, body), = node.items()
  if tag == _BYTES and type(body) is str:
    return bytes.fromhex(body)
  if tag == _BIG_INT and type(body) is str:
    return int(body, 16)
  if tag == _FLOAT and type(body) is str and body in _NON_FINITE:
    return _NON_FINITE[body]
  if type(body) is not list:
    raise ValueError(f"malformed {tag!r} entry")
  items = [_from_tagged(item, depth) for item in body]
  if tag == _TUPLE:
    return tuple(items)
  if tag == _SET:
    return set(items)
  if tag == _FROZENSET:
    return frozenset(items)
  if tag == _DICT and all(type(pair) is list and len(pair) == 2 for pair in items):
    return {key: item for key, item in items}
  if (tag == _COMPLEX and len(items) == 2 and
      all(type(part) in (int, float) for part in items)):
    return complex(*items)
  raise ValueError(f"unknown tag {tag!r}")


class _ProtocolError(Exception):
  """The worker broke the protocol; it is killed and the case is an "error"."""


class _Worker:
  """The parent's side of one sandboxed worker: pipes, deadlines, and killing it."""

  def __init__(self, limits: Limits):
    self.limits = limits
    self.isolation: dict[str, Any] = {}
    self.worker_pid: int | None = None
    self.ended = False               # dead, or no longer to be trusted: nothing more is sent
    self.end_report: str | None = None  # the launcher's "exit N" / "signal N" / "fatal ..."
    self._ended_at: float | None = None
    self._reply_eof = False
    self._reply_buffer = bytearray()
    self._launcher_buffer = bytearray()
    self.workdir = tempfile.mkdtemp(prefix="enamel-sandbox-")
    command_read, self._command_write = os.pipe()
    self._reply_read, reply_write = os.pipe()
    config = {
        "command_fd": command_read, "reply_fd": reply_write, "workdir": self.workdir,
        "memory_bytes": limits.memory_bytes, "cpu_seconds": limits.cpu_seconds,
        "file_bytes": limits.file_bytes, "max_processes": limits.max_processes,
        "reply_bytes": limits.reply_bytes, "cleanup_s": _CLEANUP_S,
    }
    environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.workdir,
                   "TMPDIR": self.workdir, "LC_ALL": "C.UTF-8"}
    try:
      self.launcher = subprocess.Popen(
          [sys.executable, "-I", "-c", _BOOTSTRAP, str(command_read), json.dumps(config)],
          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
          pass_fds=(command_read, reply_write), start_new_session=True, cwd=self.workdir,
          env=environment)
    except BaseException:
      for fd in (command_read, reply_write, self._command_write, self._reply_read):
        os.close(fd)
      shutil.rmtree(self.workdir, ignore_errors=True)
      raise
    os.close(command_read)
    os.close(reply_write)
    self._launcher_out = self.launcher.stdout.fileno()
    os.set_blocking(self._command_write, False)
    self._poller = select.poll()
    self._poller.register(self._reply_read, select.POLLIN)
    self._poller.register(self._launcher_out, select.POLLIN)

  # -- lifecycle -------------------------------------------------------------------------------

  def __enter__(self) -> _Worker:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def close(self) -> None:
    """Kills the worker and everything it started, then removes its directory."""
    self._kill()
    try:
      self.launcher.wait(timeout=_CLEANUP_S + 1)
    except subprocess.TimeoutExpired:
      _kill_group(self.launcher.pid)
      self.launcher.wait()
    self.launcher.stdout.close()
    for fd in (self._command_write, self._reply_read):
      try:
        os.close(fd)
      except OSError:
        pass
    _remove_tree(self.workdir)

  def _kill(self) -> None:
    self.ended = True
    if self.worker_pid is not None:
      _kill_group(self.worker_pid)
    elif self.launcher.poll() is None:
      # The worker's pid was never reported: end the launcher, which takes its pdeath-signalled
      # worker with it.
      _kill_group(self.launcher.pid)

  # -- protocol --------------------------------------------------------------------------------

  def load(self, program: str, entry_point: str) -> CaseResult | None:
    """Starts the program; None when it is ready for cases, else what every case gets."""
    deadline = time.monotonic() + self.limits.startup_s
    code = _worker_section_code()
    if not self._send(code, deadline):
      return self._timeout(None) if time.monotonic() >= deadline else self._death()
    try:
      message = self._exchange(pickle.dumps((program, entry_point)), deadline, "sandboxed")
      if not isinstance(message, CaseResult):
        if "status" in message:  # the worker could not isolate itself
          return self._from_failure(message, "crashed")
        self.isolation = message
        message = self._exchange(None, deadline, "ready")
    except _ProtocolError as error:
      self._kill()
      return CaseResult("error", detail=f"malformed reply from the worker: {error}")
    if isinstance(message, CaseResult):
      if message.status == "timeout":
        message.detail = f"the program did not load within {self.limits.startup_s:.1f} s"
      return message
    if "status" in message:
      return self._from_failure(message, "compile_error")
    return None

  def run_case(self, args: Sequence[Any], repeats: int, time_limit: float) -> CaseResult:
    budget = repeats * (time_limit + self.limits.tolerance_s) + _CASE_OVERHEAD_S
    deadline = time.monotonic() + budget
    command = pickle.dumps((pickle.dumps(tuple(args), pickle.HIGHEST_PROTOCOL), repeats,
                            float(time_limit)), pickle.HIGHEST_PROTOCOL)
    try:
      message = self._exchange(command, deadline, None, budget)
      if isinstance(message, CaseResult):
        return message
      return self._case_result(message, repeats)
    except _ProtocolError as error:
      self._kill()
      return CaseResult("error", detail=f"malformed reply from the worker: {error}")

  def _exchange(self, command: bytes | None, deadline: float, expected: str | None,
                budget: float | None = None) -> dict[str, Any] | CaseResult:
    """Sends `command` (if any) and returns the next reply, or the CaseResult of a failure.

    With `expected`, a reply of that status comes back without its "status" key and any other
    status as it is.
    """
    if command is not None and not self._send(command, deadline):
      return self._timeout(budget) if time.monotonic() >= deadline else self._death()
    frame = self._receive(deadline)
    if frame == "timeout":
      return self._timeout(budget)
    if frame == "ended":
      return self._death()
    try:
      message = json.loads(frame, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
      raise _ProtocolError(f"not JSON ({type(error).__name__})") from None
    if type(message) is not dict or type(message.get("status")) is not str:
      raise _ProtocolError("no status")
    if expected is not None and message["status"] == expected:
      del message["status"]
    return message

  def _case_result(self, message: dict[str, Any], repeats: int) -> CaseResult:
    status = message["status"]
    detail = message.get("detail", "")
    if type(detail) is not str:
      raise _ProtocolError("detail is not a string")
    detail = detail[:_DETAIL_CHARS]
    seconds = message.get("seconds", [])
    if (type(seconds) is not list or len(seconds) > repeats or
        not all(type(s) in (int, float) and 0 <= s < math.inf for s in seconds)):
      raise _ProtocolError("bad durations")
    seconds = [float(s) for s in seconds]
    if status == "ok":
      if len(seconds) != repeats or "output" not in message:
        raise _ProtocolError("incomplete ok reply")
      try:
        output = _from_tagged(message["output"])
      except (ValueError, TypeError, KeyError, RecursionError, OverflowError) as error:
        raise _ProtocolError(f"undecodable output ({type(error).__name__})") from None
      return CaseResult("ok", output, seconds)
    if status in ("error", "memory", "unencodable"):
      return CaseResult(status, seconds=seconds, detail=detail)
    if status in ("timeout", "crashed"):
      self._kill()
      return CaseResult(status, seconds=seconds, detail=detail)
    raise _ProtocolError(f"unknown status {status[:40]!r}")

  def _from_failure(self, message: dict[str, Any], default: str) -> CaseResult:
    """A load failure the worker reported; the worker is not used any further."""
    self._kill()
    status, detail = message["status"], message.get("detail", "")
    if status not in ("compile_error", "memory", "crashed") or type(detail) is not str:
      status, detail = default, f"unexpected reply {status[:40]!r}"
    return CaseResult(status, detail=detail[:_DETAIL_CHARS])

  def _timeout(self, budget: float | None) -> CaseResult:
    group = self.worker_pid
    self._kill()
    within = f" within {budget:.2f} s" if budget is not None else ""
    return CaseResult("timeout", detail=f"no reply{within}; killed worker process group {group}")

  def _death(self) -> CaseResult:
    """The worker died (or its launcher did): why, as far as the launcher can tell."""
    self._kill()
    deadline = time.monotonic() + _REPORT_WAIT_S
    while self.end_report is None and self._launcher_out >= 0:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        break
      if _readable(self._launcher_out, remaining):
        self._read_launcher()
    report = self.end_report or ""
    kind, _, value = report.partition(" ")
    if kind == "signal" and value.isdigit():
      number = int(value)
      name = signal.Signals(number).name if number in signal.valid_signals() else str(number)
      if number == signal.SIGXCPU:
        return CaseResult("timeout", detail=f"CPU time limit ({self.limits.cpu_seconds} s) hit")
      return CaseResult("crashed", detail=f"the worker was killed by {name}")
    if kind == "exit":
      return CaseResult("crashed", detail=f"the worker exited with code {value}")
    if kind == "fatal":
      return CaseResult("crashed", detail=f"the sandbox launcher failed: {value}")
    return CaseResult("crashed", detail="the worker's launcher died")

  # -- pipes -----------------------------------------------------------------------------------

  def _send(self, frame: bytes, deadline: float) -> bool:
    """Writes one length-prefixed frame; False if the worker is gone or the deadline passed."""
    view = memoryview(len(frame).to_bytes(_HEADER_BYTES, "big") + frame)
    poller = None
    while view:
      try:
        view = view[os.write(self._command_write, view):]
        continue
      except BlockingIOError:
        pass  # the pipe is full: the worker is still busy with earlier bytes
      except OSError:
        return False  # EPIPE: the worker is gone
      self._check_launcher()
      remaining = deadline - time.monotonic()
      if self.end_report is not None or remaining <= 0:
        return False
      if poller is None:
        poller = select.poll()
        poller.register(self._command_write, select.POLLOUT)
      poller.poll(min(remaining, 0.05) * 1000)  # short naps: also watch for the worker dying
    return True

  def _check_launcher(self) -> None:
    if self._launcher_out >= 0 and _readable(self._launcher_out, 0):
      self._read_launcher()

  def _receive(self, deadline: float) -> bytes | str:
    """One reply frame, or "timeout", or "ended" (the worker died first)."""
    if not self._fill(_HEADER_BYTES, deadline):
      return self._why_not(deadline)
    length = int.from_bytes(self._reply_buffer[:_HEADER_BYTES], "big")
    if length > self.limits.reply_bytes:
      raise _ProtocolError(f"a reply of {length} bytes exceeds {self.limits.reply_bytes}")
    if not self._fill(_HEADER_BYTES + length, deadline):
      return self._why_not(deadline)
    frame = bytes(self._reply_buffer[_HEADER_BYTES:_HEADER_BYTES + length])
    del self._reply_buffer[:_HEADER_BYTES + length]
    return frame

  def _why_not(self, deadline: float) -> str:
    return "ended" if self._reply_eof or self._ended_at is not None else "timeout"

  def _fill(self, count: int, deadline: float) -> bool:
    """Reads until the reply buffer holds `count` bytes; False on deadline or worker death."""
    while len(self._reply_buffer) < count:
      if self._reply_eof:
        return False
      now = time.monotonic()
      if self._ended_at is not None:
        # Children of the worker may hold the pipe open: give its last words a moment only.
        deadline = min(deadline, self._ended_at + _DRAIN_S)
      if now >= deadline:
        return False
      for fd, _ in self._poller.poll((deadline - now) * 1000):
        if fd == self._reply_read:
          chunk = os.read(fd, max(count - len(self._reply_buffer), 1 << 16))
          if chunk:
            self._reply_buffer += chunk
          else:
            self._reply_eof = True
            self._poller.unregister(fd)
        elif fd == self._launcher_out:
          self._read_launcher()
    return True

  def _read_launcher(self) -> None:
    chunk = os.read(self._launcher_out, _LAUNCHER_LINE_BYTES)
    if not chunk:
      self._poller.unregister(self._launcher_out)
      self._launcher_out = -1
      self._note_end("launcher ended")
      return
    self._launcher_buffer += chunk
    *lines, rest = self._launcher_buffer.split(b"\n")
    self._launcher_buffer = bytearray(rest[-_LAUNCHER_LINE_BYTES:])
    for line in lines:
      text = line.decode("ascii", "replace")
      kind, _, value = text.partition(" ")
      if kind == "worker" and self.worker_pid is None and value.isdigit():
        pid = int(value)
        # Trust but verify (the program could write to the launcher's pipe as the same user):
        # killpg on this number must hit the launcher's child, or nothing.
        if pid > 1 and _parent_pid(pid) in (self.launcher.pid, None):
          self.worker_pid = pid
      elif kind in ("exit", "signal", "fatal"):
        self._note_end(text)

  def _note_end(self, report: str) -> None:
    if self.end_report is None:
      self.end_report = report
    if self._ended_at is None:
      self._ended_at = time.monotonic()


def _readable(fd: int, timeout_s: float) -> bool:
  poller = select.poll()  # not select.select: descriptors may exceed FD_SETSIZE
  poller.register(fd, select.POLLIN)
  return bool(poller.poll(timeout_s * 1000))


def _parent_pid(pid: int) -> int | None:
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
      return int(handle.read().rsplit(")", 1)[1].split()[1])
  except (OSError, IndexError, ValueError):
    return None


def _kill_group(pgid: int) -> None:
  try:
    os.killpg(pgid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _remove_tree(path: str) -> None:
  def make_writable_and_retry(function, failed_path, _):
    try:
      os.chmod(os.path.dirname(failed_path), 0o700)
      function(failed_path)
    except OSError:
      pass

  shutil.rmtree(path, onerror=make_writable_and_retry)


def run_cases(program: str, entry_point: str, cases: Sequence[tuple[Sequence[Any], int, float]],
              limits: Limits = Limits()) -> list[CaseResult]:
  """Runs `entry_point` of `program` on each case (args, repeats, time_limit_s) in one worker.

  A case is "ok" (output = the first call's return value, seconds = every call's duration) or
  says why not. The first "timeout" or "crashed" ends the worker and the later cases are
  "not_run"; a program that cannot be loaded gives every case the same result.
  """
  cases = list(cases)
  for _, repeats, time_limit in cases:
    if int(repeats) != repeats or repeats < 1 or not time_limit > 0:
      raise ValueError(f"need repeats >= 1 and a positive time limit, got {repeats}, "
                       f"{time_limit}")
  if not cases:
    return []
  with _Worker(limits) as worker:
    failure = worker.load(program, entry_point)
    if failure is not None:
      return [dataclasses.replace(failure, seconds=[]) for _ in cases]
    results = []
    for args, repeats, time_limit in cases:
      if worker.ended:
        results.append(CaseResult("not_run", detail="the worker ended at an earlier case"))
      else:
        results.append(worker.run_case(args, int(repeats), float(time_limit)))
  return results


def describe_isolation(limits: Limits = Limits()) -> dict[str, Any]:
  """How a worker isolates itself on this machine: its uid and the namespaces it entered."""
  with _Worker(limits) as worker:
    failure = worker.load("def f():\n  return None\n", "f")
    if failure is not None:
      raise RuntimeError(f"the sandbox does not start: {failure.status} {failure.detail}")
    return dict(worker.isolation, root=os.geteuid() == 0)
