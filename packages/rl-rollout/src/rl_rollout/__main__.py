"""``python -m rl_rollout``: the same as the ``rl-rollout-server`` command."""

from rl_rollout.server import main

if __name__ == "__main__":
    main()
