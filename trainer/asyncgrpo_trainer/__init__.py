"""asyncgrpo_trainer: the single-controller asynchronous GRPO trainer an AsyncGRPOJob runs.

`python -m asyncgrpo_trainer --job-spec FILE` is the driver the head pod runs;
`asyncgrpo_trainer.local_run.main` is the same job on this machine with an embedded Ray. The
package never imports kopf or a Kubernetes client: it reports through its /progress endpoint and
its exit code, and the operator turns those into status.
"""
