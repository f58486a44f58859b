"""The trainer benchmark (`python -m asyncgrpo_trainer.bench`) stays runnable: its smallest form on CPU.

The GPU run (bench/gpu/trainer.sh) is this module with a bigger shape and --gpus; a broken flag
or report there costs a device session, so the same code path runs here: sync and one async mode,
fixed-length responses (--ignore-eos), the JSON report.
"""

from __future__ import annotations

import json
from pathlib import Path

from asyncgrpo_trainer import bench


def test_bench_reports_each_mode_with_fixed_length_responses(tmp_path: Path, ray_address: str) -> None:
    out = tmp_path / "bench.json"
    argv = "--steps 3 --warmup-steps 1 --modes sync async-in-order --max-new-tokens 6 --ignore-eos"
    argv += " --prompts 4 --generations 2 --micro-batch 8 --markdown"
    assert bench.main([*argv.split(), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["modes"]) == ["sync", "async-in-order"]
    for mode in report["modes"].values():
        assert mode["response_tokens_per_sample"] == 6  # every response ran to maxNewTokens
        assert mode["wall_s"] > 0 and mode["samples_per_s"] == 3 * 4 * 2 / mode["wall_s"]
        assert mode["wasted_samples"] >= 0


def test_a_benchmark_of_a_checkpoint_records_its_sizes_not_the_unused_tiny_defaults(tmp_path: Path) -> None:
    config = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "num_hidden_layers": 24}
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 151936, "rope_theta": 1e6}))
    recorded = bench.Shape(model_path=str(tmp_path)).report()
    assert "hidden" not in recorded and "layers" not in recorded
    assert recorded["checkpoint"]["hidden_size"] == 896 and recorded["checkpoint"]["vocab_size"] == 151936
    assert bench.Shape().report()["hidden"] == 64  # the tiny model keeps its own fields
