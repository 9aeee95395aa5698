"""benchmarks/common.py keeps one current block per benchmark in RESULTS.md: a new run replaces
its block in place, so the file reads as a status, not a log."""
import pytest

from benchmarks import common

INTRO = "# Benchmark results\n\nIntro paragraph.\n"


def results_with(*blocks: tuple[str, str]) -> str:
  text = INTRO
  for block, section in blocks:
    text = common.replace_block(text, block, section)
  return text


def test_replacing_a_block_keeps_the_others_byte_identical_and_in_place():
  before = results_with(("precision_ls", "\n## precision_ls, day 1\n\n| a |\n|---|\n| 1 |\n"),
                        ("precision_ls official", "\n## precision_ls beside official, day 1\n"),
                        ("lotus", "\n## lotus, day 1\n\n| b |\n|---|\n| 2 |\n"))
  after = common.replace_block(before, "precision_ls", "\n## precision_ls, day 2\n\n| 3 |\n")

  assert "day 1\n\n| a |" not in after and "## precision_ls, day 2\n\n| 3 |" in after
  start, end = common.block_markers("precision_ls")
  old_block = before[before.index(start):before.index(end) + len(end)]
  new_block = after[after.index(start):after.index(end) + len(end)]
  # Everything outside the replaced block, before and after it, is unchanged byte for byte.
  assert after == before.replace(old_block, new_block)
  assert after.index(start) == before.index(start)
  # The side-by-side block, whose name starts with the same word, was not touched.
  assert after.count("## precision_ls beside official, day 1") == 1
  assert after.index(new_block) < after.index("precision_ls official")


def test_a_new_block_is_appended_at_the_end():
  before = results_with(("lotus", "\n## lotus\n"))
  after = common.replace_block(before, "enamel", "\n## enamel\n")
  start, end = common.block_markers("enamel")
  assert after.startswith(before.rstrip("\n"))
  assert after.endswith(f"{start}\n\n## enamel\n\n{end}\n")
  assert common.replace_block("", "enamel", "## enamel") == f"{start}\n\n## enamel\n\n{end}\n"


def test_rerunning_with_the_same_section_changes_nothing():
  text = results_with(("lotus", "\n## lotus\n"), ("enamel", "\n## enamel\n"))
  assert common.replace_block(text, "lotus", "\n## lotus\n") == text


def test_a_start_marker_without_its_end_raises_naming_the_block():
  start, _ = common.block_markers("lotus")
  broken = f"{INTRO}\n{start}\n\n## lotus, cut short\n"
  with pytest.raises(ValueError, match="block 'lotus'"):
    common.replace_block(broken, "lotus", "## lotus")


def test_write_results_replaces_the_block_in_the_file(tmp_path):
  path = tmp_path / "RESULTS.md"
  path.write_text(INTRO, encoding="utf-8")
  common.write_results("lotus", "\n## lotus, day 1\n", path)
  common.write_results("lotus", "\n## lotus, day 2\n", path)
  text = path.read_text(encoding="utf-8")
  assert "day 1" not in text and text.count("## lotus, day 2") == 1
  assert text.startswith(INTRO)


def test_the_committed_results_file_is_well_formed():
  """Each block of RESULTS.md can be replaced: one start and one end marker per block."""
  text = common.RESULTS.read_text(encoding="utf-8")
  for block in ("precision_ls", "precision_ls official", "flow_mi", "jetformer",
                "neural_spacetimes", "neural_spacetimes official", "sg_unlearn", "enamel", "lotus",
                "diffusion_purification"):
    start, end = common.block_markers(block)
    assert text.count(f"\n{start}\n") == 1 and text.count(f"\n{end}\n") == 1, block
    common.replace_block(text, block, "## placeholder")
