"""`asyncgrpo plot s3://...` once the pods and the volume are gone: every attempt's curves, read from a
real S3 server (SeaweedFS) with the reader's own key pair."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_api.object_store_keys import logs_prefix
from asyncgrpo_cli import main as cli
from asyncgrpo_trainer import plot, tracking
from asyncgrpo_trainer.object_store import Store
from tests.objectstore.helpers import store_config
from tests.objectstore.s3server import S3Server

SAMPLES = 64
ROOT = "runs/rl/demo"


def _upload_attempt(
    store: Store, attempt: int, local: Path, steps: range, *, accuracy: float, resumed_step: int | None
) -> None:
    """What the driver's mirror uploads: the attempt's TensorBoard files under logs/attempt-N/."""
    curves = tracking.open_curves(
        str(local), job_name="demo", config={}, resumed_step=resumed_step, environ={}
    )
    for step in steps:
        record: dict[str, Any] = {
            "step": step,
            "samples_trained": step * SAMPLES,
            "reward_mean": accuracy,
            "accuracy": accuracy,
        }
        curves.write(record)
    curves.close()
    for path in (local / "tensorboard").rglob("*"):
        if path.is_file():
            rel = path.relative_to(local).as_posix()
            store.upload_file(logs_prefix(attempt) + rel, path)


def test_plot_draws_every_attempts_steps_from_the_bucket_the_resumed_ones_replaced(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    """Attempt 1 logged steps 1-6 and checkpointed at 4; its pod and volume were lost; attempt 2
    (another volume) trained 5-8. The curve is attempt 1's first four steps, then attempt 2's."""
    store = Store(store_config(s3_server, bucket, root=ROOT))
    _upload_attempt(store, 1, tmp_path / "volume-1", range(1, 7), accuracy=0.1, resumed_step=None)
    _upload_attempt(store, 2, tmp_path / "volume-2", range(5, 9), accuracy=0.9, resumed_step=4)

    url = f"s3://{bucket}/{ROOT}"
    run = plot.load_from_store(url, s3_server.endpoint, "us-east-1", tmp_path / "fetched")
    assert run.label == "demo"
    assert [x for x, _ in run.accuracy] == [s * SAMPLES for s in range(1, 9)]
    assert [round(v, 3) for _, v in run.accuracy] == [0.1] * 4 + [0.9] * 4

    out = tmp_path / "curves.png"
    assert cli.main(["plot", url, "--endpoint", s3_server.endpoint, "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_job_without_uploaded_curves_says_where_it_looked(
    s3_server: S3Server, bucket: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "curves.png"
    code = cli.main(
        ["plot", f"s3://{bucket}/runs/rl/other", "--endpoint", s3_server.endpoint, "-o", str(out)]
    )
    assert code == 1
    assert f"s3://{bucket}/runs/rl/other/logs/" in capsys.readouterr().err
    assert not out.exists()


def test_plot_from_the_bucket_with_a_wrong_key_or_no_endpoint_says_what_to_set(
    s3_server: S3Server,
    bucket: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    url = f"s3://{bucket}/{ROOT}"
    out = str(tmp_path / "curves.png")
    monkeypatch.delenv(plot.ENDPOINT_ENV, raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main(["plot", url, "-o", out])
    assert exited.value.code == 2
    assert "--endpoint URL or AWS_ENDPOINT_URL" in capsys.readouterr().err

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key")
    monkeypatch.setenv(plot.ENDPOINT_ENV, s3_server.endpoint)
    assert cli.main(["plot", url, "-o", out]) == 1
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in capsys.readouterr().err


def test_a_run_url_without_a_job_root_is_refused_with_the_expected_form() -> None:
    with pytest.raises(ValueError, match="s3://BUCKET/<prefix>/<namespace>/<job name>"):
        plot.store_location("s3://only-a-bucket")
