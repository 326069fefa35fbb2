"""The launcher and the stop signals: `python train.py --ranks N` starts its ranks here (`launch_ranks`), and SIGTERM or
SIGINT stops a run at its step's end, with a checkpoint (`StopSignals`).
"""
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

from harness import checkpoint
from harness.errors import GUARD_STOP, STOPPED, USAGE

# How long the launcher, after passing a stop signal on, waits for its ranks to finish their step and save: the longest
# seed step (4.4 minutes, GPUS.md), its evaluation and its save, as GPUS.md's sbatch script gives torchrun.
SHUTDOWN_WAIT_S = 840


def launch_ranks(ranks, program, argv, max_restarts=0, out=None):
    """Start `ranks` processes of `program argv` under torchrun's agent, in this process, and exit with the first failed
    rank's status (a usage error or a stop passed on; anything else as 1, after a line naming the rank). On a signal
    this process exits with 128 + the signal. With `max_restarts`, torchrun restarts the ranks after a failure, each
    resuming from the newest checkpoint; once spent, a line says how to resume by hand."""
    import logging
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    # Quiet the agent: its reports repeat what the ranks print; GPUS.md states the threads it sets (OMP_NUM_THREADS=1).
    for logger in [name for name in logging.root.manager.loggerDict if name.startswith("torch.distributed")]:
        logging.getLogger(logger).setLevel(logging.CRITICAL)         # each has its level (torch's LOGLEVEL)
    name, wait = os.path.basename(program), [f"--shutdown-timeout={SHUTDOWN_WAIT_S}"]
    if "--shutdown-timeout" not in torchrun.get_args_parser()._option_string_actions:      # torch < 2.12 (cuda12)
        print(f"torchrun of torch {torch.__version__} has no --shutdown-timeout: at a stop signal the ranks get its "
              f"30 s to finish their step, not {SHUTDOWN_WAIT_S}", flush=True)
        wait = []
    try:
        torchrun.run(torchrun.parse_args(["--standalone", f"--nproc_per_node={ranks}", f"--max-restarts={max_restarts}",
                                          *wait, program, *argv]))
    except ChildFailedError as failed:
        rank, first = failed.get_first_failure()
        if first.exitcode in (USAGE, GUARD_STOP, STOPPED):   # each said so in its own line
            sys.exit(first.exitcode)
        how = f"exit status {first.exitcode}" if first.exitcode > 0 else f"signal {-first.exitcode}"
        spent = f"; torchrun's {max_restarts} restart(s) are spent, and {out} keeps its newest checkpoint: continue " \
                f"by hand with python {name} --out {out} --resume" if max_restarts else ""
        print(f"{name}: rank {rank} stopped with {how}; its message is above{spent}", file=sys.stderr, flush=True)
        sys.exit(1)
    except SignalException as stop:
        sys.exit(128 + stop.sigval)


class StopSignals:
    """SIGTERM and SIGINT (preemption, Ctrl-C) ask the run to stop: every rank finishes its step, the ranks agree at its
    end (`agreed_over_ranks`: one rank's signal stops all), write a checkpoint and exit cleanly. A second signal stops
    the process at once, without either, with exit status 128 + the signal (130 for Ctrl-C). Under a launcher (--ranks,
    torchrun) Ctrl-C reaches the launcher alone, which passes the first signal on and at a second sends every worker
    SIGTERM. A torchrun worker also stops as on SIGTERM once its launcher is gone.

    Why a watcher thread and os._exit: a Python signal handler runs in the main thread between bytecodes, which a rank
    blocked in a C call (a collective whose peer is gone, vLLM's forward) might never reach. So a watcher thread reads
    each signal from the C handler's pipe (signal.set_wakeup_fd) and calls os._exit at the second. What it cuts short
    is safe: a checkpoint being written stays .partial, metrics.jsonl's half-written line is dropped on resume."""
    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, out, rank):
        self.out, self.rank, self.received, self.count = out, rank, None, 0
        self.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        self.pipe = os.pipe()                              # (read end, write end)
        os.set_blocking(self.pipe[1], False)               # the C handler's write never waits
        self.previous_fd = signal.set_wakeup_fd(self.pipe[1])
        # the Python-level handler does nothing (the watcher acts); it replaces KeyboardInterrupt
        self.previous = {s: signal.signal(s, lambda signum, frame: None) for s in self.SIGNALS}
        self.watcher = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
        self.watcher.start()

    def _watch(self):
        while True:
            for number in os.read(self.pipe[0], 64):      # one byte per signal, as it arrives
                if number == 0:                            # restore(): the loop is over
                    return
                if number in self.SIGNALS:                 # another signal Python handles is not ours
                    self._receive(signal.Signals(number))

    def _receive(self, stop):
        self.count += 1
        if self.count == 1:
            self.received = stop.name
            if self.rank == 0:
                print(f"received {stop.name}: finishing this step, then writing a checkpoint (a second signal "
                      f"stops at once, without them)", flush=True)
            return
        if self.rank == 0:
            newest, world = checkpoint.latest(self.out), int(os.environ.get("WORLD_SIZE", 1))
            kept = f"the newest complete checkpoint, {newest}, is kept: continue with: python train.py --out " \
                   f"{self.out} --resume{f' --ranks {world}' if world > 1 else ''}" if newest else \
                "there is no complete checkpoint yet: start the run again (with --overwrite)"
            print(f"received {stop.name}, a second stop signal: stopped at once; {kept}", flush=True)
            sys.stderr.flush()
        os._exit(128 + stop)

    def agreed_over_ranks(self, device):
        if self.launcher is not None and os.getppid() != self.launcher and self.received is None:
            print(f"the launcher (pid {self.launcher}) is gone: finishing this step, then writing a checkpoint",
                  flush=True)
            self.received = "launcher gone"
        flag = torch.tensor([float(self.received is not None)], device=device)
        dist.all_reduce(flag)
        return flag.item() > 0

    def restore(self):
        """The handlers from before, and the watcher ended (once the loop is over, a signal acts as before it)."""
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self.previous_fd)
        os.write(self.pipe[1], b"\0")
        self.watcher.join()
        for fd in self.pipe:
            os.close(fd)
