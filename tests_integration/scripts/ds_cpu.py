"""DeepSpeed on CPU processes without its shared-memory inference op (test launches only).

When DeepSpeed's torch communication backend starts on the CPU accelerator it JIT-builds
``deepspeed_shm_comm`` (g++ on two C++ files, 60-120 s on 2 cores in every fresh environment,
as the CI's is) for one collective, ``inference_all_reduce``, which only DeepSpeed's inference
layers call; ZeRO training reduces through ``torch.distributed`` (gloo here) either way. The
launched test processes mark the op incompatible before DeepSpeed starts, so no launch builds
it; nothing a training step computes changes. When DeepSpeed no longer probes its ops this way,
this says so on stderr and changes nothing (the op is then built, slowly, as before).
"""

from __future__ import annotations

import sys

#: ``ShareMemCommBuilder.NAME``: the op's key in ``deepspeed.ops.__compatible_ops__``.
SHM_OP = "deepspeed_shm_comm"


def skip_shm_comm_op() -> None:
    """Keep DeepSpeed from building ``deepspeed_shm_comm`` in this process (module docstring)."""
    import deepspeed.ops

    ops = getattr(deepspeed.ops, "__compatible_ops__", {})  # probed on first access, then kept
    if SHM_OP not in ops:
        print(f"ds_cpu: DeepSpeed lists no {SHM_OP} op to skip: it may build it", file=sys.stderr)
        return
    ops[SHM_OP] = False


if __name__ == "__main__":  # ``torchrun ds_cpu.py -m MODULE ARGS``: run MODULE as ``python -m``
    import runpy

    if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
        raise SystemExit("usage: ds_cpu.py -m MODULE [ARGS...]")
    skip_shm_comm_op()
    module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
