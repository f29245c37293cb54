"""Training, method-agnostic: what every method's run uses. The runner loop and the trained state, the Task protocol
the methods implement, distributed set-up, sampling, the data order, validations, metrics, EMA, the run's
components (the reward-hacking guard among them), stopping, preflight checks and the run's folder (`run_folder/`:
checkpoints, resume, exports, the run lock). Group RL's rollout machinery lives with its methods, in
sanarl/methods/group_rl/."""
