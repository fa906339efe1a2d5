"""What every plan is sized from: the model's facts, its KV budget, the GPUs and the host's memory, the machine
(this one or a described rig), its CPU sets and the serving shape. Imports nothing else of `glm53.plan`."""
