"""backports/megatron/job/ and ray_workers.py: the start-up hook and its trigger, job start
in real interpreters, ranks, Ray workers, the proofs a job reads."""
