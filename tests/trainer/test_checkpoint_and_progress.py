"""Checkpoints: atomic step directories with pruning, the policy worker's own file in them (CPU
tensors, written and read by the worker, never through the controller), resume from it; and the
/progress and /metrics documents."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncgrpo_trainer import checkpoint, driver, progress
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy
from asyncgrpo_trainer.buffer import GroupRecord, ReplayBuffer
from asyncgrpo_trainer.envs.base import Example
from tests.http_status import http_status
from tests.skip_policy import requires_cuda
from tests.trainer.test_grpo_math import BUILD, _rows

OPTIM = policy.OptimConfig(
    learning_rate=1e-2,
    weight_decay=0.01,
    max_grad_norm=0.5,
    warmup_steps=0,
    micro_batch_size=4,
    logprob_batch_size=4,
    temperature=1.0,
)


def _policy(device: str = "cpu") -> policy.TorchPolicyWorker:
    """A torch policy with the KL term on, so the checkpoint holds a reference model too."""
    loss = losses.LossConfig(reference_policy_kl_penalty=0.05)
    return policy.TorchPolicyWorker(BUILD, OPTIM, loss, rank=0, world_size=1, device=device)


def _training_rows() -> list[policy.TrainRow]:
    rows = _rows(8)
    ref = _policy().reference_logprobs([(r.prompt_ids, r.response_ids) for r in rows])
    return [
        policy.TrainRow(r.prompt_ids, r.response_ids, r.generation_logprobs, r.advantage, lp)
        for r, lp in zip(rows, ref, strict=True)
    ]


def _step(worker: policy.TorchPolicyWorker, rows: list[policy.TrainRow]) -> None:
    worker.train_chunk(rows)
    worker.finish_step()


def _checkpoint(root: Path, step: int, worker: policy.TorchPolicyWorker) -> Path:
    """What the controller does: begin, the policy writes its file, commit the controller's state."""
    tmp = checkpoint.begin(root, step)
    worker.save(str(tmp))
    return checkpoint.commit(tmp, step, {"step": step}, keep_last=2)


def _controller_only(root: Path, step: int, payload: dict[str, Any], *, keep_last: int) -> Path:
    """A checkpoint with the controller's `payload` and no policy file."""
    return checkpoint.commit(checkpoint.begin(root, step), step, payload, keep_last=keep_last)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def test_checkpoints_are_renamed_into_place_and_only_the_newest_are_kept(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _controller_only(tmp_path, step, {"step": step}, keep_last=2)
    assert checkpoint.list_steps(tmp_path) == [2, 3]
    assert checkpoint.latest(tmp_path) == 3
    assert checkpoint.load(tmp_path, 3) == {"step": 3}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_checkpoint_killed_between_begin_and_commit_leaves_the_previous_one(tmp_path: Path) -> None:
    _controller_only(tmp_path, 1, {"step": 1}, keep_last=3)
    torn = checkpoint.begin(tmp_path, 2)
    checkpoint.write(torn / policy.POLICY_FILE, {"model": torch.zeros(4)})  # the policy's file, no commit
    (tmp_path / "step-00000009").mkdir()  # no meta file: not a checkpoint
    assert checkpoint.list_steps(tmp_path) == [1]
    _controller_only(tmp_path, 2, {"step": 2}, keep_last=3)
    assert not torn.exists() and checkpoint.latest(tmp_path) == 2


def test_saving_a_step_again_replaces_its_directory_whole(tmp_path: Path) -> None:
    for value in (0.0, 1.0):
        tmp = checkpoint.begin(tmp_path, 2)
        checkpoint.write(tmp / policy.POLICY_FILE, {"model": torch.full((4,), value)})
        checkpoint.commit(tmp, 2, {"step": 2, "value": value}, keep_last=3)
    final = checkpoint.step_dir(tmp_path, 2)
    assert checkpoint.load(tmp_path, 2)["value"] == 1.0
    assert bool((torch.load(final / policy.POLICY_FILE)["model"] == 1.0).all())
    assert sorted(p.name for p in tmp_path.iterdir()) == [final.name]  # the old one is gone


def test_a_checkpoint_holds_the_controllers_state_and_the_policys_own_file(tmp_path: Path) -> None:
    worker = _policy()
    _step(worker, _training_rows())
    final = _checkpoint(tmp_path, 1, worker)
    assert sorted(p.name for p in final.iterdir()) == ["meta.json", "policy.pt", "state.pt"]
    assert checkpoint.load(tmp_path, 1) == {"step": 1}  # nothing of the policy in the controller's file
    saved = torch.load(final / policy.POLICY_FILE, weights_only=True)
    assert saved.keys() == {"model", "optimizer", "steps_taken", "reference"}
    assert saved["steps_taken"] == 1 and saved["optimizer"]["state"] and saved["reference"]
    assert all(t.device.type == "cpu" for t in _tensors(saved))


def test_a_resumed_policy_continues_from_the_saved_weights_and_optimizer_state(tmp_path: Path) -> None:
    rows = _training_rows()
    first = _policy()
    _step(first, rows)
    final = _checkpoint(tmp_path, 1, first)
    _step(first, rows)  # step 2 of the run that goes on
    resumed = _policy()
    resumed.load(str(final))
    assert resumed.steps_taken == 1
    _step(resumed, rows)  # step 2 of the resumed run: AdamW's moments decide it
    want = first.model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in resumed.model.state_dict().items())


def test_a_missing_policy_file_names_the_file_and_the_field(tmp_path: Path) -> None:
    _controller_only(tmp_path, 1, {"step": 1}, keep_last=1)  # e.g. written by another backend
    with pytest.raises(FileNotFoundError, match=r"has no policy\.pt: .*spec\.trainer\.policy\.backend"):
        _policy().load(str(checkpoint.step_dir(tmp_path, 1)))


def test_a_worker_without_the_checkpoint_volume_hands_its_file_to_the_controller(tmp_path: Path) -> None:
    """A worker pod that does not mount the head's checkpoint directory (no PVC: the default)
    returns its file instead of failing the job; the group writes it, and it resumes like one
    the worker wrote."""
    worker = _policy()
    _step(worker, _training_rows())
    unseen = tmp_path / "other-node" / ".tmp-00000001-x"
    files = worker.save(str(unseen))
    assert list(files) == ["policy.pt"] and not unseen.parent.exists()
    tmp = checkpoint.begin(tmp_path / "ckpt", 1)
    checkpoint.write_returned(tmp, files)
    final = checkpoint.commit(tmp, 1, {"step": 1}, keep_last=1)
    resumed = _policy()
    resumed.load(str(final))
    want = worker.model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in resumed.model.state_dict().items())


@requires_cuda()
def test_a_checkpoint_written_on_a_gpu_resumes_on_a_cpu_and_the_other_way_round(tmp_path: Path) -> None:
    """The controller and a CPU process can open a GPU rank's file, and each side keeps its own
    AdamW kernel (fused on CUDA) after loading the other's optimizer state."""
    rows = _training_rows()
    gpu = _policy("cuda")
    _step(gpu, rows)
    from_gpu = _checkpoint(tmp_path / "gpu", 1, gpu)
    saved = torch.load(from_gpu / policy.POLICY_FILE, weights_only=True)  # no map_location
    assert all(t.device.type == "cpu" for t in _tensors(saved))
    cpu = _policy("cpu")
    cpu.load(str(from_gpu))
    assert not cpu.optimizer.param_groups[0]["fused"]
    _step(cpu, rows)
    from_cpu = _checkpoint(tmp_path / "cpu", 2, cpu)
    back = _policy("cuda")
    back.load(str(from_cpu))
    assert back.steps_taken == 2 and back.optimizer.param_groups[0]["fused"]
    _step(back, rows)
    assert back.steps_taken == 3
    assert all(torch.isfinite(v).all() for v in back.model.state_dict().values())


class _WritesAMarker:
    """What a tool call or the job's code could leave in `state.pt`: unpickling it calls `open`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_state_file_holding_a_pickled_object_is_refused_at_resume_and_nothing_of_it_runs(
    tmp_path: Path,
) -> None:
    root, marker = tmp_path / "ckpt", tmp_path / "marker"
    final = _controller_only(root, 1, {"step": 1}, keep_last=1)
    torch.save({"step": 1, "buffer": _WritesAMarker(marker)}, final / checkpoint.STATE_FILE)
    with pytest.raises(
        checkpoint.UnsafeCheckpointError, match=f"refusing to resume from {final / 'state.pt'}"
    ):
        driver.resume_state(str(root))
    assert not marker.exists()


def test_the_controllers_whole_state_resumes_through_the_plain_data_load(tmp_path: Path) -> None:
    """Everything `controller._checkpoint` stores (a buffer with a scored group and one in flight,
    chat prompts, the queue, the loader, the counters) loads back as it was saved."""
    buffer = ReplayBuffer()
    chat = Example("2+2?", "4", chat=(("user", "2+2?"),), row={"prompt": "2+2?", "answer": "4", "id": 7})
    done = buffer.reserve(chat, start_version=0, target_step=1)
    record = GroupRecord(
        [1, 2], [[3, 4]], [[-0.5, -0.25]], [1.0], [True], [True], 0, 0, 1, tool_outcomes=["ok"]
    )
    buffer.commit(done, record, end_version=1)
    buffer.reserve(Example("1+1?", "2"), start_version=1, target_step=None)
    state = {
        "step": 3,
        "batch_index": 4,
        "buffer": buffer.state_dict(),
        "pending": [({"prompt": "3+3?", "answer": "6", "chat": (), "row": {"prompt": "3+3?"}}, 2)],
        "loader": {"epoch": 1, "position": 5},
        "counters": {"groups_committed": 9.0, "reward_failures": 0.0},
        "validation_reward": 0.5,
        "validation_accuracy": None,
    }
    _controller_only(tmp_path, 3, state, keep_last=1)
    resumed = driver.resume_state(str(tmp_path))
    assert resumed is not None and resumed[1] == checkpoint.step_dir(tmp_path, 3)
    assert checkpoint.load(tmp_path, 3) == state
    restored = ReplayBuffer.from_state_dict(resumed[0].buffer)
    assert [(s.example, s.record) for s in restored.ordered()] == [
        (s.example, s.record) for s in buffer.ordered()
    ]


def test_no_checkpoint_directory_means_no_resume(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path / "missing") is None


def test_the_drivers_progress_and_metrics_answer_only_the_jobs_ray_token() -> None:
    """In a job's pod the driver's server takes the job's Ray token (its Secret, RAY_AUTH_TOKEN), as
    Ray's dashboard does: without it 401, with another 403; only /healthz says anything to anyone."""
    server = progress.ProgressServer(0, host="127.0.0.1", token="the-jobs-token")
    try:
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/progress", "/metrics"):
            assert http_status(base + path) == 401
            assert http_status(base + path, "Bearer not-the-jobs-token") == 403
            assert http_status(base + path, "the-jobs-token") == 401  # not a bearer token
            assert http_status(base + path, "Bearer the-jobs-token") == 200
        assert http_status(base + "/progress?x=1") == 401
        assert http_status(base + "/healthz") == 200
    finally:
        server.close()


def test_progress_server_serves_camel_case_json_and_prometheus_text() -> None:
    server = progress.ProgressServer(0, host="127.0.0.1")
    try:
        server.update(
            step=3,
            max_steps=10,
            reward_mean=0.5,
            accuracy=0.25,
            validation_accuracy=0.875,
            state="failed",
            error="boom",
            counters={"groups_committed": 7},
            policy_idle_share=0.75,
            generation_idle_shares=[0.1, 0.5],
        )
        base = f"http://127.0.0.1:{server.port}"
        doc = json.load(urllib.request.urlopen(f"{base}/progress"))
        for key in (
            "step",
            "maxSteps",
            "policyVersion",
            "rewardMean",
            "meanStaleness",
            "tokensPerSecond",
            "lastCheckpointStep",
            "validationReward",
            "accuracy",
            "validationAccuracy",
            "state",
            "error",
        ):
            assert key in doc
        assert (doc["step"], doc["state"], doc["error"]) == (3, "failed", "boom")
        text = urllib.request.urlopen(f"{base}/metrics").read().decode()
        assert "asyncgrpo_step 3" in text and 'asyncgrpo_state{state="failed"} 1' in text
        assert "asyncgrpo_accuracy 0.25" in text and "asyncgrpo_validation_accuracy 0.875" in text
        assert "asyncgrpo_groups_committed_total 7" in text
        assert "asyncgrpo_policy_idle_share 0.75" in text  # who waits for whom, per engine too
        assert 'asyncgrpo_generation_engine_idle_share{engine="1"} 0.5' in text
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/nope")
    finally:
        server.close()


def test_tokens_per_second_covers_the_latest_steps_so_a_run_that_stopped_generating_does_not_show_zero() -> (
    None
):
    steps = [{"tokens_per_second": 100.0, "step_seconds": 2.0} for _ in range(12)]
    steps += [{"tokens_per_second": 0.0, "step_seconds": 1.0}]  # the last step trained what was generated
    assert progress.recent_token_rate(steps) == pytest.approx(9 * 200.0 / (9 * 2.0 + 1.0))
    assert progress.recent_token_rate([]) is None
