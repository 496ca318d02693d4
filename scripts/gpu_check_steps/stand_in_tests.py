"""The tests scripts/gpu_check.sh --stand-in runs in place of tests/gpu (stand_in.py): one passes, one fails after
printing what it saw, so the check's evidence of a failure (tests_gpu.txt, tests_gpu.xml) is tested for real."""


def test_the_stand_in_passes():
    assert sum(range(4)) == 6


def test_the_stand_in_fails_and_its_output_is_kept():
    seen = {"backend": "stand-in", "losses": [5.5, 5.6]}
    print(f"stand-in output to keep: {seen}")
    assert seen["losses"][-1] < seen["losses"][0], f"the loss did not fall: {seen['losses']}"
