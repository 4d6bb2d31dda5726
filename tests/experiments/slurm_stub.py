"""Stand-ins for SLURM's sbatch, srun, sacct, scancel and scontrol, for tests/experiments/test_launch.py.

The test links each command's name to this file in a folder it puts first on ``PATH``; the state lives in
``$SLURM_STUB_DIR``. ``sbatch`` keeps the batch script (``<id>.sh``), prints ``Submitted batch job <id>`` and,
unless ``SLURM_STUB_HOLD`` is set, runs each array task in the background as SLURM would on one node: the script
under ``bash`` with the task's SLURM variables, again while ``scontrol requeue`` asked for it. ``srun`` runs its
command with its ``--output``/``--error`` patterns filled in and records its PID, to which ``scancel --signal``
sends the signal. ``sacct`` prints the states. Every call is appended to ``calls.log``.
"""

import os
import re
import signal
import subprocess
import sys
import time

STATE = os.environ["SLURM_STUB_DIR"]


def path(name):
  return os.path.join(STATE, name)


def write(name, text):
  with open(path(name) + ".tmp", "w") as f:
    f.write(text)
  os.replace(path(name) + ".tmp", path(name))


def read(name, default=""):
  return open(path(name)).read() if os.path.exists(path(name)) else default


def sbatch(args):
  script = args[-1]
  text = open(script).read()
  job = 1000 + len([n for n in os.listdir(STATE) if n.endswith(".sh")])
  write(f"{job}.sh", text)
  array = re.search(r"^#SBATCH --array=0-(\d+)", text, re.M)
  tasks = range(int(array.group(1)) + 1) if array else [None]
  for i in tasks:
    task = f"{job}_{i}" if array else str(job)
    write(f"{task}.state", "PENDING")
    if not os.environ.get("SLURM_STUB_HOLD"):
      subprocess.Popen([sys.executable, __file__, "--run-task", str(job), "" if i is None else str(i), script],
                       start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  print(f"Submitted batch job {job}")


def run_task(job, index, script):
  task = f"{job}_{index}" if index else job
  env = dict(os.environ, SLURM_JOB_ID=str(int(job) + 1 + int(index or 0)), SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1",
             SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_STEP_NODELIST="localhost",
             SLURM_JOB_NODELIST="localhost")
  if index:
    env.update(SLURM_ARRAY_JOB_ID=job, SLURM_ARRAY_TASK_ID=index)
  while True:
    write(f"{task}.state", "RUNNING")
    code = subprocess.call(["bash", path(f"{job}.sh")], env=env)
    if os.path.exists(path(f"{task}.requeue")):
      os.remove(path(f"{task}.requeue"))
      write(f"{task}.state", "REQUEUED")
      continue
    write(f"{task}.state", "COMPLETED" if code == 0 else "FAILED")
    return


def srun(args):
  words, i = [], 0
  files = {}
  while i < len(args):
    if args[i] in ("--output", "--error"):
      files[args[i]] = args[i + 1]
      i += 2
    elif args[i].startswith("--"):
      i += 1
    else:
      words = args[i:]
      break
  task = os.environ.get("SLURM_ARRAY_JOB_ID", "")
  task = f"{task}_{os.environ['SLURM_ARRAY_TASK_ID']}" if task else os.environ["SLURM_JOB_ID"]
  fill = lambda p: (p.replace("%A", os.environ.get("SLURM_ARRAY_JOB_ID", "")).replace(
      "%a", os.environ.get("SLURM_ARRAY_TASK_ID", "")).replace("%j", os.environ["SLURM_JOB_ID"]).replace("%t", "0"))
  out = open(fill(files["--output"]), "a")
  err = open(fill(files.get("--error", files["--output"])), "a")
  os.dup2(out.fileno(), 1)
  os.dup2(err.fileno(), 2)
  write(f"{task}.pid", str(os.getpid()))
  os.execvp(words[0], words)


def sacct(args):
  jobs = [args[i + 1] for i, a in enumerate(args) if a == "-j"]
  print("JobID|State|NodeList")
  for name in sorted(os.listdir(STATE)):
    if name.endswith(".state") and name.split("_")[0].split(".")[0] in jobs:
      print(f"{name[:-len('.state')]}|{read(name)}|localhost")


def scancel(args):
  sig = next((a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args)
              if a.startswith("--signal")), "TERM")
  task = [a for a in args if re.fullmatch(r"\d+(_\d+)?", a)][0]
  os.kill(int(read(f"{task}.pid")), getattr(signal, "SIG" + sig.removeprefix("SIG")))


def scontrol(args):
  assert args[0] == "requeue", args
  write(f"{args[1]}.requeue", "")


def main():
  name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
  if args and args[0] == "--run-task":
    return run_task(*args[1:])
  with open(path("calls.log"), "a") as f:
    f.write(" ".join([name, *args]) + f"  # {time.time():.3f}\n")
  {"sbatch": sbatch, "srun": srun, "sacct": sacct, "scancel": scancel, "scontrol": scontrol}[name](args)


if __name__ == "__main__":
  main()
