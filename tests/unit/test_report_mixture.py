"""The report's parts of a mixture and an import: the data-mixture table (each source's weight, realised share per
segment, validation loss), a validation line per source in the loss plot and TensorBoard, and the header's init_from
line; a plain corpus and random weights add none of them."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import make_config
from trainflow.data.mixture import SourceShare
from trainflow.report import plots, sections
from trainflow.report.mixture import mixture_section
from trainflow.train.step_log import EvalRecord

SHARES = [SourceShare("web", 0.75, 1152, 0.75), SourceShare("code", 0.25, 384, 0.25)]
EVALS = [
    EvalRecord(step=0, val_loss=5.5, sources={"web": 5.4, "code": 5.8}),
    EvalRecord(step=6, val_loss=4.0, sources={"web": 3.9, "code": 4.3}),
]


def test_the_mixture_table_gives_every_source_its_share_per_segment_and_loss():
    segments = [SimpleNamespace(segment=i, mixture=SHARES) for i in range(2)]
    lines = mixture_section(segments, EVALS)
    assert lines[0] == "### Data mixture"
    rows = [row for line in lines for row in line.splitlines() if row.startswith("| `")]
    assert rows == [
        "| `web` | 75.0% | 75.00% (1,152) | 75.00% (1,152) | 5.4000 -> 3.9000 |",
        "| `code` | 25.0% | 25.00% (384) | 25.00% (384) | 5.8000 -> 4.3000 |",
    ]
    one = [SimpleNamespace(segment=0, mixture=[SourceShare("corpus", 1.0, 1536, 1.0)])]
    assert mixture_section(one, [EvalRecord(step=0, val_loss=5.5, sources={"corpus": 5.5})]) == []


def test_the_loss_plot_draws_each_sources_validation_loss(monkeypatch, tmp_path):
    drawn = {}
    monkeypatch.setattr(plots, "save", lambda fig, out: drawn.update(labels=fig.axes[0].get_legend_handles_labels()[1]))
    steps = [SimpleNamespace(step=s, loss=5.0 - s / 10) for s in range(6)]
    plots.plot_loss(steps, EVALS, tmp_path / "loss.png")
    assert drawn["labels"] == ["train", "validation", "validation: code", "validation: web"]
    plots.plot_loss(steps, [EvalRecord(step=0, val_loss=5.5, sources={"corpus": 5.5})], tmp_path / "loss.png")
    assert drawn["labels"] == ["train", "validation"]


def test_the_header_names_the_folder_step_0_came_from(monkeypatch, tmp_path):
    cfg = make_config("report", tmp_path)
    monkeypatch.setattr(sections, "data_parallel", lambda d: "dp1 (replicate)")
    fp8 = SimpleNamespace(recipe="none")
    layout = SimpleNamespace(tp=1, pp=1, schedule="1f1b", virtual_stages=1, microbatches=1, world_size=1)
    last = SimpleNamespace(parameters=1e6, layout=layout, precision="fp32", activations="keep", compile=False, fp8=fp8)
    assert not any(
        "initialised" in line for line in sections.header(cfg, SimpleNamespace(**vars(last), init_from=None))
    )
    lines = sections.header(cfg, SimpleNamespace(**vars(last), init_from="/hf/llama3_8b"))
    assert "Step 0 was initialised from the Hugging Face weights in `/hf/llama3_8b` (io.init_from)" in "\n".join(lines)


def test_tensorboard_gets_one_scalar_per_source(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainflow.train.tensorboard import TensorBoardLog

    board = TensorBoardLog(tmp_path)
    for e in EVALS:
        board.evaluation(e.step, e.val_loss, e.sources)
    board.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["eval/val_loss", "eval/val_loss/code", "eval/val_loss/web"]
    assert [round(s.value, 5) for s in events.Scalars("eval/val_loss/code")] == [5.8, 4.3]  # stored as float32
