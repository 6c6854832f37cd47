"""The launcher of the hundred-twenty-eighth training-program style (tests/programs/
hundredtwentyeighth_style_train.py), NVIDIA/tacotron2's multiproc.py as its README runs it,
`python -m multiproc train.py --output_directory=outdir --log_directory=logdir
--hparams=distributed_run=True,fp16_run=False`, copied into each run's folder as multiproc.py.

One subprocess.Popen per GPU with --n_gpus, --group_name=group_<timestamp> and --rank=K appended;
rank 0 keeps the console, every other rank's stdout (not its stderr) goes to
logs/<timestamp>_GPU_<K>.log; then it waits on each process in turn: no watchdog, no exit code
checked, nobody killed when a rank dies. On this CPU host torch.cuda.device_count() is 0: the
number of processes comes from N_GPUS (2 when unset), the only change from the original.
"""

# ruff: noqa: RUF005, SIM115, UP032 (tacotron2's own launcher, as it is written)
import os
import subprocess
import sys
import time

import torch

argslist = list(sys.argv)[1:]
num_gpus = torch.cuda.device_count() or int(os.environ.get("N_GPUS", "2"))
argslist.append("--n_gpus={}".format(num_gpus))
workers = []
job_id = time.strftime("%Y_%m_%d-%H%M%S")
argslist.append("--group_name=group_{}".format(job_id))

for i in range(num_gpus):
    argslist.append("--rank={}".format(i))
    stdout = None if i == 0 else open("logs/{}_GPU_{}.log".format(job_id, i), "w")
    print(argslist)
    p = subprocess.Popen([str(sys.executable)] + argslist, stdout=stdout)
    workers.append(p)
    argslist = argslist[:-1]

for p in workers:
    p.wait()
