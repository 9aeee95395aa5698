"""ENAMEL problem set and sample files: loading, and clear errors on malformed sample files."""
import json

import pytest

from jaxlab.methods.enamel import problems


def test_problem_set_and_shipped_samples():
  all_problems = problems.load_problems()
  assert len(all_problems) == 164 and len(problems.PROBLEMSET) == 142
  assert all(len(p.levels) == 4 for p in all_problems)
  for name in problems.SAMPLE_FILES:
    samples = problems.load_samples(problems.sample_file_path(name))
    assert sorted(samples) == list(problems.PROBLEMSET)
    assert all(len(v) == 1 and isinstance(v[0], str) for v in samples.values())


def write(tmp_path, payload, text=None):
  path = tmp_path / "samples.json"
  path.write_text(text if text is not None else json.dumps(payload))
  return path


@pytest.mark.parametrize("payload,message", [
    ([["x"]] * 10, "lists 10 problems"),
    ({"0": ["x"]}, "no programs for problems"),
    ("just a string", "must hold a JSON list"),
    ([["x"]] * 163 + [[1]], None),
    ([["x"]] * 163 + [[]], "non-empty list"),
    ({"zero": ["x"]}, "problem indices"),
])
def test_malformed_sample_files_get_clear_errors(tmp_path, payload, message):
  if message is None:   # a non-string program in a problem of the set, or outside it
    payload = [["x"]] * 164
    payload[0] = [1]
    message = "not strings"
  with pytest.raises(ValueError, match=message):
    problems.load_samples(write(tmp_path, payload))


def test_the_142_problem_list_form_and_bad_json(tmp_path):
  samples = problems.load_samples(write(tmp_path, [["p"]] * 142))
  assert sorted(samples) == list(problems.PROBLEMSET)
  with pytest.raises(ValueError, match="not valid JSON"):
    problems.load_samples(write(tmp_path, None, text="[[ oops"))
  with pytest.raises(FileNotFoundError):
    problems.load_samples(tmp_path / "missing.json")
