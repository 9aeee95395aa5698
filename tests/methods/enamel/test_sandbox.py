"""The sandbox against hostile programs: each test fails if the isolation it names is broken."""
from __future__ import annotations

import math
import os
import pathlib
import re
import shutil
import signal
import socket
import tempfile
import threading
import time

import pytest

from jaxlab.methods.enamel import sandbox

LIMITS = sandbox.Limits(memory_bytes=512 * 2**20, cpu_seconds=20, startup_s=10.0)
TIME_LIMIT = 0.3
# A hung case costs repeats * (time limit + tolerance) + 1 s; anything far slower is a bug.
PROMPT_S = 8.0
IS_ROOT = os.geteuid() == 0
REPO = pathlib.Path(__file__).resolve().parents[3]


def run(program: str, cases, entry_point: str = "f", limits: sandbox.Limits = LIMITS):
  return sandbox.run_cases(program, entry_point, cases, limits)


def run_once(program: str, args: tuple = (), **kwargs) -> sandbox.CaseResult:
  return run(program, [(args, 1, TIME_LIMIT)], **kwargs)[0]


def timed(program: str, cases, **kwargs):
  start = time.monotonic()
  results = run(program, cases, **kwargs)
  return results, time.monotonic() - start


def _stat_fields(pid: str) -> list[str]:
  with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
    return handle.read().rsplit(")", 1)[1].split()


def sandbox_processes() -> list[int]:
  """Live processes descended from this test process that carry the sandbox's marker."""
  parents, commands = {}, {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      parents[int(entry)] = int(_stat_fields(entry)[1])
      with open(f"/proc/{entry}/cmdline", "rb") as handle:
        commands[int(entry)] = handle.read()
    except (OSError, IndexError, ValueError):
      continue
  found = []
  for pid, command in commands.items():
    if sandbox.MARKER.encode() not in command:
      continue
    ancestor = parents.get(pid)
    while ancestor not in (None, 0, 1):
      if ancestor == os.getpid():
        found.append(pid)
        break
      ancestor = parents.get(ancestor)
  return found


def assert_no_leftovers() -> None:
  deadline = time.monotonic() + 2.0
  while sandbox_processes() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert sandbox_processes() == []


@pytest.fixture(scope="module")
def isolation():
  return sandbox.describe_isolation(LIMITS)


# -- correct programs --------------------------------------------------------------------------


def test_correct_program_outputs_durations_and_repeats():
  program = ("from typing import List\nimport heapq, collections\n"
             "def f(xs: List[int], k):\n"
             "  return heapq.nsmallest(k, xs), collections.Counter(xs)[xs[0]]\n")
  results = run(program, [(([5, 1, 4, 1], 2), 3, 1.0), (([9, 8], 1), 1, 1.0)])
  assert [r.status for r in results] == ["ok", "ok"]
  assert results[0].output == ([1, 1], 1) and type(results[0].output) is tuple
  assert results[1].output == ([8], 1)
  assert len(results[0].seconds) == 3 and len(results[1].seconds) == 1
  assert all(0 < s < 1.0 for r in results for s in r.seconds)


def test_every_call_gets_a_fresh_copy_of_the_inputs():
  program = "def f(xs):\n  xs.append(0)\n  return len(xs)\n"
  inputs = [1, 2]
  result = run(program, [((inputs,), 4, 1.0)])[0]
  assert result.status == "ok" and result.output == 3 and len(result.seconds) == 4
  assert inputs == [1, 2]


def test_inputs_and_outputs_larger_than_a_pipe_buffer():
  big = list(range(10**6))
  result = run("def f(xs):\n  return xs[::-1], sum(xs)\n", [((big,), 2, 5.0)])[0]
  assert result.status == "ok" and result.output == (big[::-1], sum(big))


def test_an_exception_is_an_error_with_its_type_name_and_the_next_case_runs():
  program = "def f(x):\n  if x < 0:\n    raise ValueError('negative')\n  return x * 2\n"
  results = run(program, [((-1,), 2, 1.0), ((4,), 1, 1.0)])
  assert (results[0].status, results[0].detail) == ("error", "ValueError")
  assert (results[1].status, results[1].output) == ("ok", 8)


def test_per_case_overhead_and_startup_are_small():
  start = time.monotonic()
  results = run("def f(x):\n  return x + 1\n", [((i,), 1, 1.0) for i in range(500)])
  elapsed = time.monotonic() - start
  assert [r.output for r in results] == list(range(1, 501))
  # Measured ~0.1 ms per case and ~40 ms per start; the bounds only catch gross regressions.
  assert elapsed < 10.0
  start = time.monotonic()
  for _ in range(5):
    assert run_once("def f():\n  return 1\n").status == "ok"
  assert (time.monotonic() - start) / 5 < 2.0


def test_concurrent_evaluations_do_not_interfere():
  outputs = {}

  def evaluate(index):
    outputs[index] = [r.output for r in run(f"def f(x):\n  return x + {index}\n",
                                            [((i,), 1, 1.0) for i in range(20)])]

  threads = [threading.Thread(target=evaluate, args=(index,)) for index in range(3)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert outputs == {index: [i + index for i in range(20)] for index in range(3)}


# -- hangs and resource bombs ------------------------------------------------------------------


def _killed_group(detail: str) -> int:
  match = re.search(r"process group (\d+)", detail)
  assert match, detail
  return int(match.group(1))


@pytest.mark.parametrize("program", [
    "def f():\n  while True:\n    try:\n      pass\n    except BaseException:\n      pass\n",
    "import os, signal\ndef f():\n  os.kill(os.getpid(), signal.SIGSTOP)\n",
])
def test_a_hung_call_times_out_and_is_killed(program):
  results, elapsed = timed(program, [((), 2, TIME_LIMIT), ((), 1, TIME_LIMIT)])
  assert [r.status for r in results] == ["timeout", "not_run"]
  assert elapsed < PROMPT_S
  with pytest.raises(ProcessLookupError):
    os.killpg(_killed_group(results[0].detail), 0)
  assert_no_leftovers()


def test_a_call_slower_than_the_limit_is_a_timeout_reported_by_the_worker():
  program = "import time\ndef f():\n  time.sleep(0.4)\n  return 1\n"
  results = run(program, [((), 3, 0.1), ((), 1, 1.0)])
  assert [r.status for r in results] == ["timeout", "not_run"]
  assert len(results[0].seconds) == 1 and results[0].seconds[0] > 0.1


def test_a_fork_bomb_is_stopped_and_leaves_no_process_behind():
  program = ("import os\ndef f():\n  while True:\n    try:\n      os.fork()\n"
             "    except BaseException:\n      pass\n")
  result, elapsed = timed(program, [((), 1, TIME_LIMIT)])
  assert result[0].status != "ok"
  assert elapsed < PROMPT_S
  assert_no_leftovers()


def _processes_with_argument(argument: str) -> list[int]:
  found = []
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as handle:
        if argument.encode() in handle.read().split(b"\0"):
          found.append(int(entry))
    except (OSError, ValueError):
      continue
  return found


def test_processes_that_escape_into_their_own_session_are_killed():
  # The escapees become `sleep` processes with an argument unique to this test, so they are
  # found wherever they end up in the process tree.
  marker = f"999.{os.getpid()}{time.monotonic_ns() % 10**6}"
  program = ("import os\ndef f(marker):\n  for _ in range(4):\n    if os.fork() == 0:\n"
             "      os.setsid()\n      if os.fork() == 0:\n"
             "        os.execv('/bin/sleep', ['sleep', marker])\n"
             "      os._exit(0)\n  return 7\n")
  result = run_once(program, (marker,))
  assert (result.status, result.output) == ("ok", 7)
  deadline = time.monotonic() + 2.0
  while _processes_with_argument(marker) and time.monotonic() < deadline:
    time.sleep(0.05)
  leftovers = _processes_with_argument(marker)
  for pid in leftovers:  # do not leave them behind if the test fails
    os.kill(pid, signal.SIGKILL)
  assert leftovers == []
  assert_no_leftovers()


@pytest.mark.parametrize("body", [
    "  return len(bytearray(10**10))\n",
    "  blocks = []\n  while True:\n    blocks.append(bytearray(10**7))\n",
])
def test_a_memory_bomb_hits_the_memory_limit(body):
  result, elapsed = timed("def f():\n" + body, [((), 1, 5.0), ((), 1, 5.0)])
  assert result[0].status in ("memory", "crashed"), result
  assert elapsed < PROMPT_S


@pytest.mark.parametrize("program", [
    "def f(n=0):\n  return f(n + 1)\n",
    "import sys\nsys.setrecursionlimit(10**8)\ndef f(n=0):\n  return f(n + 1)\n",
])
def test_deep_recursion_fails(program):
  result, elapsed = timed(program, [((), 1, TIME_LIMIT)])
  if "setrecursionlimit" not in program:
    assert (result[0].status, result[0].detail) == ("error", "RecursionError")
  # Without the limit, Python 3.11 frames live on the heap: a crash, MemoryError or time-out.
  assert result[0].status in ("error", "crashed", "memory", "timeout"), result
  assert elapsed < PROMPT_S


@pytest.mark.parametrize("writer", [
    "print('x' * 10**7)",
    "os.write(1, b'x' * 10**7)\n    os.write(2, b'x' * 10**7)",
    "sys.stderr.write('y' * 10**7)",
])
def test_printing_gigabytes_neither_blocks_nor_fills_the_disk(writer):
  program = (f"import os, sys\ndef where():\n  return os.getcwd()\n"
             f"def f():\n  while True:\n    {writer}\n")
  workdir = run_once(program, entry_point="where").output
  results, elapsed = timed(program, [((), 1, TIME_LIMIT)])
  assert results[0].status == "timeout"
  assert elapsed < PROMPT_S
  assert isinstance(workdir, str) and not os.path.exists(workdir)


def test_files_are_limited_in_size_and_removed_afterwards():
  program = ("import os\ndef f(n):\n  with open('big', 'wb') as out:\n"
             "    out.write(b'x' * n)\n  return os.path.abspath('big')\n")
  limits = sandbox.Limits(memory_bytes=512 * 2**20, file_bytes=2**20)
  results = run(program, [((2**19,), 1, 5.0), ((2**21,), 1, 5.0)], limits=limits)
  assert results[0].status == "ok"
  assert (results[1].status, results[1].detail) == ("error", "OSError")  # EFBIG
  assert not os.path.exists(results[0].output)


# -- attacks on the evaluator ------------------------------------------------------------------


@pytest.mark.parametrize("attack", [
    "os.kill(os.getppid(), signal.SIGKILL)",
    "os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
    "os.kill(os.getppid(), signal.SIGTERM)\n  os.kill(os.getppid(), signal.SIGSTOP)",
])
def test_killing_the_parent_leaves_the_evaluator_alive(attack):
  program = f"import os, signal, time\ndef f():\n  {attack}\n  time.sleep(0.2)\n  return 1\n"
  results = run(program, [((), 1, 1.0), ((), 1, 1.0)])
  assert results[0].status != "ok", results
  assert run_once("def f():\n  return 2\n").output == 2  # still evaluating


def test_the_evaluator_cannot_be_signalled_when_running_as_root(isolation):
  if not IS_ROOT:
    pytest.skip("as a normal user the worker shares the evaluator's uid (best-effort only)")
  assert isolation["uid"] != 0
  # Signal 0 checks the permission without delivering anything.
  result = run_once("import os\ndef f(pid):\n  os.kill(pid, 0)\n  return 'reachable'\n",
                    (os.getpid(),))
  assert (result.status, result.detail) == ("error", "PermissionError")


@pytest.mark.parametrize("program", [
    "import sys\nsys.exit(0)\ndef f():\n  return 1\n",
    "import os\nos._exit(0)\ndef f():\n  return 1\n",
    "import sys\ndef f():\n  sys.exit(0)\n",
    "import os\ndef f():\n  os._exit(0)\n",
    "import os, signal\ndef f():\n  os.kill(os.getpid(), signal.SIGSEGV)\n",
])
def test_exiting_is_a_crash(program):
  results = run(program, [((), 1, 1.0), ((), 1, 1.0)])
  assert results[0].status == "crashed", results
  assert results[1].status in ("crashed", "not_run")


def _protected_directory(parent: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  directory = parent / "protected"
  directory.mkdir()
  target = directory / "data.txt"
  target.write_text("precious")
  target.chmod(0o644)
  directory.chmod(0o755)
  return directory, target


_VANDAL = """import os, shutil
def f(directory, target, outside, relative_outside):
  attempts = [
      lambda: open(target, 'w').write('overwritten'),
      lambda: os.remove(target),
      lambda: os.chmod(target, 0o777),
      lambda: os.rename(target, target + '.moved'),
      lambda: shutil.rmtree(directory),
      lambda: open(os.path.join(directory, 'new.txt'), 'w').write('x'),
      lambda: open(outside, 'w').write('escaped'),
      lambda: open(relative_outside, 'w').write('escaped'),
  ]
  failures = 0
  for attempt in attempts:
    try:
      attempt()
    except OSError:
      failures += 1
  return failures
"""


def test_files_outside_the_working_directory_are_protected(tmp_path):
  directory, target = _protected_directory(tmp_path)
  # The worker's directory is a fresh one in the temporary directory: ".." is that directory.
  outside = pathlib.Path(tempfile.gettempdir()) / f"enamel-sandbox-escape-{os.getpid()}"
  relative = pathlib.Path(tempfile.gettempdir()) / f"enamel-sandbox-relative-{os.getpid()}"
  try:
    result = run_once(_VANDAL, (str(directory), str(target), str(outside), f"../{relative.name}"))
    assert result.status == "ok", result
    if not IS_ROOT and target.read_text() != "precious":
      pytest.skip("as a normal user the worker can write the evaluator's files (best-effort)")
    assert target.read_text() == "precious" and sorted(os.listdir(directory)) == ["data.txt"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    assert not outside.exists() and not relative.exists()
  finally:
    for path in (outside, relative):
      path.unlink(missing_ok=True)


def test_a_uid_drop_protects_files_the_worker_can_see():
  # Unlike tmp_path (under /tmp, which the worker's private tmpfs hides), this directory is
  # visible to the worker: only the permissions keep it from writing there.
  if not IS_ROOT:
    pytest.skip("only a root evaluator can move the worker to another uid")
  parent = pathlib.Path(tempfile.mkdtemp(dir=REPO / "workdirs" if (REPO / "workdirs").is_dir()
                                         else REPO))
  try:
    parent.chmod(0o755)
    directory, target = _protected_directory(parent)
    result = run_once(_VANDAL, (str(directory), str(target), str(parent / "outside.txt"),
                                str(parent / "relative.txt")))
    assert result.status == "ok", result
    assert result.output == 8  # every attempt failed
    assert target.read_text() == "precious" and sorted(os.listdir(directory)) == ["data.txt"]
    assert sorted(os.listdir(parent)) == ["protected"]
  finally:
    shutil.rmtree(parent)


def test_no_network_connection_reaches_the_host():
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    program = ("import socket\ndef f(port):\n"
               "  connection = socket.create_connection(('127.0.0.1', port), timeout=1)\n"
               "  connection.sendall(b'stolen answers')\n  return 'connected'\n")
    result = run_once(program, (port,))
    with pytest.raises(socket.timeout):
      listener.accept()
  assert result.status != "ok", result


def test_monkeypatched_builtins_stay_in_the_worker():
  program = ("import builtins\nbuiltins.len = lambda x: 0\n"
             "builtins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
             "builtins.range = None\nbuiltins.MemoryError = KeyError\n"
             "def f(xs):\n  for name in ('str', 'int', 'float', 'tuple', 'list', 'dict', 'bool',\n"
             "               'memoryview', 'min', 'BaseException', 'Exception'):\n"
             "    setattr(builtins, name, None)\n"
             "  return [len(xs), (1, 2.5, True), {'k': xs}]\n")
  results = run(program, [(([1, 2, 3],), 3, 1.0), (([4],), 1, 1.0)])
  assert [r.status for r in results] == ["ok", "ok"], results
  assert results[0].output == [0, (1, 2.5, True), {"k": [1, 2, 3]}]
  assert len(results[0].seconds) == 3
  assert type(results[0].output[1]) is tuple
  assert len([1, 2]) == 2 and isinstance(1, int) and type(1) is int and str(1) == "1"


@pytest.mark.parametrize("payload", [
    b"\xff\xff\xff\xff",                                  # a frame larger than the cap
    b"\x00\x00\x00\x08not json",
    b'\x00\x00\x00\x2f{"status":"ok","output":{"x":1},"seconds":[0.0]}',
    b'\x00\x00\x00\x1e{"status":"ok","output":NaN,"s":1}',
])
def test_forged_replies_are_errors(payload):
  program = (f"import os\ndef f():\n  for fd in range(3, 64):\n    try:\n"
             f"      os.write(fd, {payload!r})\n    except OSError:\n      pass\n  return 1\n")
  results, elapsed = timed(program, [((), 1, 1.0), ((), 1, 1.0)])
  assert results[0].status == "error" and "malformed" in results[0].detail, results
  assert results[1].status == "not_run"
  assert elapsed < PROMPT_S


def test_an_output_larger_than_the_reply_cap_is_an_error():
  limits = sandbox.Limits(memory_bytes=512 * 2**20, reply_bytes=2**20)
  results = run("def f(n):\n  return 'x' * n\n", [((2**21,), 1, 5.0), ((3,), 1, 5.0)],
                limits=limits)
  assert results[0].status == "error"
  assert (results[1].status, results[1].output) == ("ok", "xxx")


# -- outputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("returned", [
    "Liar()",
    "LyingList([1])",
    "Int(3)",
    "(1, [Liar()])",
    "{'a': Int(1)}",
    "(x for x in range(3))",
    "Liar",
])
def test_values_that_are_not_plain_builtins_are_unencodable(returned):
  program = ("class Liar:\n  __eq__ = lambda self, other: True\n  __hash__ = object.__hash__\n"
             "class LyingList(list):\n  __eq__ = lambda self, other: True\n"
             "class Int(int):\n  pass\n"
             f"def f():\n  return {returned}\n")
  result = run_once(program)
  assert result.status == "unencodable" and result.output is None, result


VALUES = [
    None, True, False, 0, -7, 2**63 - 1, 2**63, -2**200, 10**5000, 1.5, -0.0, math.inf, -math.inf,
    "", "héllo\x00\ud800", b"", b"\x00\xff", [], (), {}, set(), frozenset(),
    [1, (2, [3, {4: (5,)}])], ((1, 2), (3,)), {(1, "a"): [None], 2: {3: frozenset({4})}},
    {1, 2.5, "x", (1, 2)}, {"b": 1, "a": 2}, [[[[[]]]]], 3 + 4j, complex(math.inf, -0.0),
    # Flat lists take a fast path unless an item needs a tag or the types are mixed.
    [1, 2, 3], [1, 2**70, -3], [-2**63], [0.5, -0.0], [1.5, math.inf], [True, 1, 1.0, None, "1"],
    ["a", "b"], [False, True], [[1, 2], [3, 4]],
]


def _identical(left, right) -> bool:
  if type(left) is not type(right):
    return False
  if isinstance(left, float):
    return (math.isnan(left) and math.isnan(right)) or (
        left == right and math.copysign(1, left) == math.copysign(1, right))
  if isinstance(left, (list, tuple)):
    return len(left) == len(right) and all(map(_identical, left, right))
  if isinstance(left, dict):
    return list(left) == list(right) and all(_identical(left[k], right[k]) for k in left)
  return left == right


@pytest.mark.parametrize("value", VALUES + [float("nan"), [float("nan"), (-0.0,)]],
                         ids=lambda value: type(value).__name__)
def test_encode_decode_round_trip(value):
  assert _identical(sandbox.decode_value(sandbox.encode_value(value)), value)


def test_values_round_trip_through_a_worker():
  program = ("import math\ndef f(values):\n"
             "  return values + [10**5000, float('nan'), complex(math.inf, -0.0), {-0.0}]\n")
  result = run_once(program, (VALUES,))
  assert result.status == "ok", result
  assert _identical(result.output[:len(VALUES)], VALUES)
  big, nan, infinite, negative_zero = result.output[len(VALUES):]
  assert big == 10**5000 and math.isnan(nan) and negative_zero == {0.0}
  assert _identical(infinite, complex(math.inf, -0.0))


@pytest.mark.parametrize("value", [
    type("Sub", (int,), {})(1), type("Sub", (list,), {})(), True.__class__.__mro__[1],
    object(), bytearray(b"x"), range(3), print, [1, [2, object()]],
])
def test_encode_rejects_anything_else(value):
  with pytest.raises(sandbox.UnencodableError):
    sandbox.encode_value(value)


def test_encode_rejects_cycles_and_deep_nesting():
  cyclic = []
  cyclic.append(cyclic)
  deep = []
  for _ in range(200):
    deep = [deep]
  for value in (cyclic, deep):
    with pytest.raises(sandbox.UnencodableError):
      sandbox.encode_value(value)


@pytest.mark.parametrize("text", [
    "NaN", "[Infinity]", '{"t": [1], "s": [2]}', '{"x": 1}', '{"d": [[1]]}', '{"d": [[[1], 2]]}',
    '{"s": [[1]]}', '{"f": "zero"}', '{"i": 5}', '{"b": "zz"}', '{"c": [1]}', "[" * 5000,
    "1" * 5000, "{", "",
])
def test_decode_rejects_malformed_text(text):
  with pytest.raises(ValueError):
    sandbox.decode_value(text)


# -- programs that do not load -----------------------------------------------------------------


@pytest.mark.parametrize("program", [
    "def f(:\n  return 1\n",
    "def g():\n  return 1\n",
    "f = 3\n",
    "raise RuntimeError('at import')\ndef f():\n  return 1\n",
    "import module_that_does_not_exist\ndef f():\n  return 1\n",
])
def test_a_program_that_does_not_load_is_a_compile_error(program):
  results = run(program, [((), 1, 1.0), ((), 1, 1.0)])
  assert [r.status for r in results] == ["compile_error", "compile_error"], results


def test_a_program_that_hangs_while_loading_times_out():
  limits = sandbox.Limits(memory_bytes=512 * 2**20, startup_s=1.0)
  results, elapsed = timed("while True:\n  pass\ndef f():\n  return 1\n", [((), 1, 1.0)] * 2,
                           limits=limits)
  assert [r.status for r in results] == ["timeout", "timeout"]
  assert elapsed < PROMPT_S
  assert_no_leftovers()


def test_invalid_cases_are_rejected_up_front():
  with pytest.raises(ValueError):
    run("def f():\n  return 1\n", [((), 0, 1.0)])
  assert run("def f():\n  return 1\n", []) == []
