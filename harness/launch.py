"""The launcher and the stop signals: `python train.py --ranks N` starts its ranks here (`launch_ranks`), and
SIGTERM or SIGINT stops a run at its step's end, with a checkpoint (`StopSignals`).
"""
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

from harness import checkpoint
from harness.errors import GUARD_STOP, STOPPED, USAGE


def launch_ranks(ranks, program, argv, max_restarts=0, out=None):
    """Start `ranks` processes of `program argv` under torchrun's launcher (its agent, in this process), and
    exit with the status of the first rank that failed. Each rank reports its own failure: a mistake in the
    settings or inputs as one line from the first rank (status 2, to which nothing is added here), anything
    else as its traceback, followed by one line that names the rank. A signal reaches the ranks as under
    torchrun (each finishes its step and writes a checkpoint; a second one, which torchrun's agent passes on as
    SIGTERM, stops them at once: StopSignals); this process then exits with 128 + the signal. With `max_restarts`,
    torchrun starts the ranks again after a failure, up to that many times, and each restart continues the run from
    its newest checkpoint (`as_an_attempt`); when they are spent, one line says so and how to continue by hand."""
    import logging
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    # The agent's own reports repeat what the ranks print, followed by its traceback; and the threads it sets
    # (OMP_NUM_THREADS=1 for each of several ranks) GPUS.md states.
    for logger in [name for name in logging.root.manager.loggerDict if name.startswith("torch.distributed")]:
        logging.getLogger(logger).setLevel(logging.CRITICAL)         # each has its level (torch's LOGLEVEL)
    name = os.path.basename(program)
    try:
        torchrun.run(torchrun.parse_args(["--standalone", f"--nproc_per_node={ranks}", f"--max-restarts={max_restarts}",
                                          program, *argv]))
    except ChildFailedError as failed:
        rank, first = failed.get_first_failure()
        if first.exitcode in (USAGE, GUARD_STOP, STOPPED):   # a usage error, a guard's stop, a stop with its
                                                                # checkpoint: each said so in its line
            sys.exit(first.exitcode)
        how = f"exit status {first.exitcode}" if first.exitcode > 0 else f"signal {-first.exitcode}"
        spent = f"; torchrun's {max_restarts} restart(s) are spent, and {out} keeps its newest checkpoint: continue " \
                f"by hand with python {name} --out {out} --resume" if max_restarts else ""
        print(f"{name}: rank {rank} stopped with {how}; its message is above{spent}", file=sys.stderr, flush=True)
        sys.exit(1)
    except SignalException as stop:
        sys.exit(128 + stop.sigval)


class StopSignals:
    """SIGTERM and SIGINT (a scheduler's preemption, Ctrl-C) ask the run to stop: every rank
    finishes its step, and at the step's end the ranks agree (an all-reduce: one rank's signal
    stops them all), write a checkpoint and exit cleanly. A second signal stops the process at once,
    without finishing the step or writing a checkpoint: rank 0 says, in one line, which complete
    checkpoint is kept and how to continue from it, and the process exits with 128 + the signal's
    number (130 for SIGINT, 143 for SIGTERM), as a shell reports a process a signal ended.

    Who gets the second signal. `python train.py` in a terminal: Ctrl-C reaches its process group,
    this process. Under a launcher (--ranks, torchrun) the workers run in sessions of their own, so
    a terminal's Ctrl-C reaches the launcher alone: its agent sends the first signal on to every
    worker and waits for them; a second one interrupts that wait, and on its way out the agent sends
    every worker SIGTERM, each worker's second signal. A scheduler's SIGTERM to the launcher is sent
    on as the first one was.

    How it stops at once. A Python signal handler runs in the main thread between bytecodes: a rank
    blocked in a C call (a collective waiting for a peer, a long operator, vLLM's forward in this
    process) would not run it until the call returns, which for a collective whose peer has gone may
    be never, and two signals that arrive meanwhile count as one. So the handlers installed here do
    nothing in the main thread; the C-level handler behind them also writes each signal's number to
    a pipe (signal.set_wakeup_fd) the moment it arrives, whatever the main thread is doing, and a
    thread of this class reads the pipe, counts the signals and, at the second, calls os._exit.
    That thread needs the GIL only for a moment, and the calls a step blocks in release it (torch's
    operators, gloo's collectives, file and socket I/O); a C call that held it throughout would
    delay the exit until it returned. os._exit rather than an exception: an exception is raised in
    the main thread, by the same handlers, only once the C call returns; and it would run `finally`
    blocks and atexit hooks, which wait for collectives, the engine and the helper processes.
    os._exit runs none of them, and what it cuts short is safe: a checkpoint being written stays a
    .partial folder, which no resume takes (checkpoint.py); a checkpoint being pruned was renamed to
    one first; metrics.jsonl loses at most the line of the step in progress, which a resume drops
    (MetricsLog.truncate); the grader's helper process (answers.py) ends when its parent is gone.

    So does the end of the launcher: torchrun starts its workers in sessions of their own, so a
    `kill -9` of torchrun (or of its process group) leaves them running, still writing into --out.
    A worker started by torchrun (TORCHELASTIC_RUN_ID is set) remembers its parent; once its
    parent is another process (the launcher died and it was re-parented), it stops as on SIGTERM."""
    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, out, rank):
        self.out, self.rank, self.received, self.count = out, rank, None, 0
        self.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        self.pipe = os.pipe()                              # (read end, write end)
        os.set_blocking(self.pipe[1], False)               # the C handler's write never waits
        self.previous_fd = signal.set_wakeup_fd(self.pipe[1])
        self.previous = {s: signal.signal(s, self._in_main_thread) for s in self.SIGNALS}
        self.watcher = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
        self.watcher.start()

    @staticmethod
    def _in_main_thread(signum, frame):
        """The Python-level handler: nothing to do (the watcher acts); it replaces KeyboardInterrupt."""

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
            print(f"received {stop.name}, a second stop signal: stopped at once; {kept}",
                  flush=True)
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
