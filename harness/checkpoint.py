"""Checkpoints: all a run needs to continue exactly where it stopped, written with no process holding the whole model.

    OUT/checkpoints/step_S/
        weights/         DCP (torch.distributed.checkpoint): the policy, its AdamW state, the EMA teacher (coreward2/3)
        trainer.pt       the step, the LR scheduler, the data order and cursor, the data-shuffle generator
        rng_rank{R}.pt   rank R's global torch RNG (it draws the mini-batch order), and CUDA's on a GPU
        config.json      the run's resolved configuration (train.py --resume reads it)
        hf/              the model's Hugging Face config, generation_config (its end tokens) and tokenizer (`to_hf`)

Atomic: each rank writes its part into step_S.partial/, which rank 0 renames to step_S/ once all of it is on disk
(`publish`): even a machine's crash leaves no torn step_S/, and `latest` never picks .partial. final/ likewise. Nodes
must share OUT's filesystem. Not saved: the start model (--model) and the engine's RNG, which nothing draws from.
"""
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from tqdm import tqdm

from harness.errors import MissingInput, OutOfDisk
from harness.sharding import reshard

LOAD_ERRORS = (Exception, dcp.api.CheckpointException)   # what an unreadable checkpoint raises (DCP's: a BaseException)
STEP_DIR = re.compile(r"step_(\d+)")        # a complete checkpoint's folder name; a killed save's ends in .partial


@dataclasses.dataclass
class Trained:
    """The models' part of what a checkpoint saves and restores (the data order is data.Questions' `state`)."""
    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    teacher: torch.nn.Module | None       # the EMA teacher of the teacher methods


def step_dir(out, step):
    return os.path.join(out, "checkpoints", f"step_{step}")


def complete(out):
    """[(step, path)] of the complete checkpoints in `out`, oldest first."""
    root = os.path.join(out, "checkpoints")
    return sorted((int(m.group(1)), os.path.join(root, name))
                  for name in (os.listdir(root) if os.path.isdir(root) else []) if (m := STEP_DIR.fullmatch(name)))


def latest(out):
    found = complete(out)
    return found[-1][1] if found else None


def is_checkpoint(path):
    """A complete checkpoint: a step_S folder (never a .partial one) with its trainer state and configuration."""
    return STEP_DIR.fullmatch(os.path.basename(os.path.normpath(path))) is not None and \
        os.path.isfile(os.path.join(path, "trainer.pt")) and os.path.isfile(os.path.join(path, "config.json"))


FULL_HASH_BYTES = 64 << 20     # files up to this size are hashed whole; larger ones by SAMPLED_BLOCKS of 1 MiB
SAMPLED_BLOCKS = 64


def model_fingerprint(model_dir):
    """{file: sha256} of --model's files, for a resume; a large file's: of its size and SAMPLED_BLOCKS 1 MiB blocks."""
    prints = {}
    for name in sorted(n for n in os.listdir(model_dir) if os.path.isfile(os.path.join(model_dir, n))):
        path = os.path.join(model_dir, name)
        digest, size = hashlib.sha256(), os.path.getsize(path)
        with open(path, "rb") as f:
            if size <= FULL_HASH_BYTES:
                digest.update(f.read())
            else:
                digest.update(str(size).encode())
                for k in range(SAMPLED_BLOCKS):
                    f.seek((size - (1 << 20)) * k // (SAMPLED_BLOCKS - 1))
                    digest.update(f.read(1 << 20))
        prints[name] = digest.hexdigest()
    return prints


def questions_fingerprint(pairs):
    """{"questions": count, "sha256": of texts and answers in order}: the list a checkpoint's data order indexes."""
    text = json.dumps([[p.original, p.rephrased, p.answer] for p in pairs], ensure_ascii=False)
    return {"questions": len(pairs), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def fingerprint_changes(saved, now):
    changes = []
    if saved["questions"] != now["questions"]:
        (a, b) = saved["questions"], now["questions"]
        changes.append(f"the training questions: {a['questions']} questions (sha256 {a['sha256'][:12]}) when saved, "
                       f"{b['questions']} (sha256 {b['sha256'][:12]}) now; a changed data file, dataset version or "
                       f"tokenizer (which changes which prompts are too long) gives other questions to the saved "
                       f"data order")
    if saved["model"] != now["model"]:
        a, b = saved["model"], now["model"]
        files = sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))
        changes.append(f"the start model's files ({', '.join(files)}); the frozen reference and the engine are loaded "
                       f"from it")
    return changes


def read_config(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def _weights(policy, optimizer, teacher):
    model, optim = get_state_dict(policy, optimizer)
    teacher_state = {} if teacher is None else {"teacher": get_model_state_dict(teacher)}
    return {"policy": model, "optimizer": optim, **teacher_state}


def fsync_files(*paths):
    for path in paths:
        files = [os.path.join(d, f) for d, _, names in os.walk(path) for f in names] if os.path.isdir(path) else [path]
        for name in files:
            with open(name, "rb") as f:
                os.fsync(f.fileno())


def _fsync_folder(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(partial, final):
    """Rank 0: rename `partial` (its files synced: fsync_files) to `final`, its folders and the rename synced too."""
    for folder, _, _ in os.walk(partial):
        _fsync_folder(folder)
    os.rename(partial, final)
    _fsync_folder(os.path.dirname(os.path.abspath(final)))


def save(out, step, policy, optimizer, teacher, trainer_state, config, tokenizer, keep_last):
    """Write OUT/checkpoints/step_S (collective), then keep the newest `keep_last` (0: all); returns its path."""
    rank, final = dist.get_rank(), step_dir(out, step)
    partial = final + ".partial"
    if rank == 0:
        if os.path.exists(partial):                         # a save of this step that was killed
            shutil.rmtree(partial)
        os.makedirs(partial)
    dist.barrier()
    reshard(*(m for m in (policy, teacher) if m is not None))
    dcp.save(_weights(policy, optimizer, teacher), checkpoint_id=os.path.join(partial, "weights"))
    rng = {"torch": torch.get_rng_state()} | ({"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_available() else {})
    torch.save(rng, os.path.join(partial, f"rng_rank{rank}.pt"))
    fsync_files(os.path.join(partial, f"rng_rank{rank}.pt"))                # DCP syncs the shards it writes
    if rank == 0:
        torch.save({**trainer_state, "step": step, "world_size": dist.get_world_size()},
                   os.path.join(partial, "trainer.pt"))
        for part in (policy.config, policy.generation_config, tokenizer):
            part.save_pretrained(os.path.join(partial, "hf"))
        with open(os.path.join(partial, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
    dist.barrier()                                          # every rank's part is on disk
    if rank == 0:
        if os.path.exists(final):                           # this step saved before, by a run resumed from earlier
            shutil.rmtree(final)
        fsync_files(partial)                                # DCP's .metadata too, which DCP leaves unsynced
        publish(partial, final)
        prune(out, keep_last)
    dist.barrier()
    return final


def checkpoint_bytes(policy, teacher):
    """One checkpoint's bytes: fp32 weights (each tied name), AdamW's fp32 moments, the EMA teacher's; no DCP header."""
    every_name = lambda model: sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    unique = sum(p.numel() for p in policy.parameters())
    return 4 * (every_name(policy) + 2 * unique + (every_name(teacher) if teacher is not None else 0))


def final_model_bytes(policy):
    """What final/ takes on disk: the policy's fp32 weights, a tied tensor once (safetensors)."""
    return 4 * sum(p.numel() for p in policy.parameters())


def run_disk_bytes(one_checkpoint, model_bytes, keep_last, saves):
    """Most a run's folder holds: while a save is written, the --keep_last before it; at the end those and final/."""
    if keep_last == 0 or keep_last >= saves:
        return saves * one_checkpoint + model_bytes
    return max((keep_last + 1) * one_checkpoint, keep_last * one_checkpoint + model_bytes)


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def disk_of(path):
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def prune(out, keep_last):
    """Remove all but the newest `keep_last` checkpoints (0: all), and .partial folders. Each is renamed .partial first,
    so a kill while removing it leaves no torn step_S."""
    for _, path in complete(out)[:-keep_last] if keep_last else []:
        if os.path.exists(path + ".partial"):               # a killed save of that step, long superseded
            shutil.rmtree(path + ".partial")
        os.rename(path, path + ".partial")
    root = os.path.join(out, "checkpoints")
    for name in os.listdir(root):
        if name.endswith(".partial"):
            shutil.rmtree(os.path.join(root, name))


def read_trainer_state(path):
    return torch.load(os.path.join(path, "trainer.pt"), weights_only=True)


def load(path, policy, optimizer, teacher):
    """Load a checkpoint into policy, optimizer, teacher and this rank's RNG (collective); returns the trainer state."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = _weights(policy, optimizer, teacher)
    dcp.load(state, checkpoint_id=os.path.join(path, "weights"))
    set_state_dict(policy, optimizer, model_state_dict=state["policy"], optim_state_dict=state["optimizer"])
    if teacher is not None:
        set_model_state_dict(teacher, state["teacher"])
    trainer = read_trainer_state(path)
    if trainer["world_size"] == world_size:
        rng = torch.load(os.path.join(path, f"rng_rank{rank}.pt"), weights_only=True)
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"])
    elif rank == 0:
        print(f"resuming a {trainer['world_size']}-rank run on {world_size} rank(s): the weights, optimizer state and "
              f"data order carry over, but the ranks' mini-batch orders start afresh, so the run will not equal "
              f"an uninterrupted one bit for bit")
    return trainer


def read_model(path, name="policy"):
    """The checkpoint's policy (or teacher) as a whole Hugging Face model, in one process, without a process group."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    if not is_checkpoint(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint "
                                "(a step_S folder with trainer.pt and config.json)")
    hf = os.path.join(path, "hf")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf), dtype=torch.float32)
    if os.path.isfile(os.path.join(hf, "generation_config.json")):  # saved since it is kept (else derived from config)
        model.generation_config = GenerationConfig.from_pretrained(hf)
    state = {name: model.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(path, "weights"), no_dist=True)
    model.load_state_dict(state[name])
    return model


def to_hf(path, dst):
    """Write the checkpoint's policy as a Hugging Face model folder (transformers and vLLM load it)."""
    from transformers import AutoTokenizer
    read_model(path).save_pretrained(dst)
    AutoTokenizer.from_pretrained(os.path.join(path, "hf")).save_pretrained(dst)
    mark_model_folder(dst, read_config(path)["preset"])
    return dst


RUN_MARK = "nanocoreward.json"       # in a model folder a run wrote (final/, to_hf): its preset, for config.preset_of


def mark_model_folder(folder, preset):
    with open(os.path.join(folder, RUN_MARK), "w") as f:
        json.dump({"preset": preset}, f)


def model_folder_for_all_ranks(model):
    """The local folder of --model: a folder as given, or a Hugging Face id (`org/name`) from the hub cache, downloaded
    by each node's first rank (a collective once the process group is up); else MissingInput, saying what to do."""
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise MissingInput(f"--model {model}: the folder holds no config.json, so it is not a Hugging Face "
                               f"model folder (one from save_pretrained, or a hub download). Nothing was run")
        return path
    parts = model.split("/")
    if model.startswith(("/", "./", "../", "~")) or len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0])) \
            or os.path.exists(path):
        raise MissingInput(f"--model {model}: no such folder{' (it is a file)' if os.path.exists(path) else ''}. "
                           f"Give a model folder, or a Hugging Face id such as Qwen/Qwen3-4B-Base. Nothing was run")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError
    failed = None
    try:
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:                   # the node's first rank
            try:
                snapshot_download(model, local_files_only=True)       # cached: no network needed
            except LocalEntryNotFoundError:
                print(f"--model {model}: not in the Hugging Face cache; downloading it", flush=True)
                snapshot_download(model)
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HFValidationError, OSError) as e:
        failed = e
    if dist.is_initialized():                      # the other ranks wait here for their node's download
        outcomes = [None] * dist.get_world_size()
        dist.all_gather_object(outcomes, None if failed is None else f"{type(failed).__name__}: {failed}")
        failed = next((o for o in outcomes if o is not None), None)
    if failed is not None:
        raise MissingInput(f"--model {model} is no folder here, and as a Hugging Face id it is neither in the cache "
                           f"(HF_HUB_CACHE, ~/.cache/huggingface/hub) nor could it be downloaded "
                           f"({str(failed).splitlines()[0][:200]}). Download it where there is a network (hf download "
                           f"{model}) and use that cache, or give the model's folder. Nothing was run") from None
    return snapshot_download(model, local_files_only=True)


def disk_bytes(trained, args):
    """(one checkpoint's bytes, the most the run's folder holds at once), with DCP's 2 KiB record of each tensor."""
    tensors = sum(len(list(m.named_parameters(remove_duplicate=False))) for m in (trained.policy, trained.teacher)
                  if m is not None) + 3 * len(list(trained.policy.parameters()))      # AdamW: step and two moments
    one = checkpoint_bytes(trained.policy, trained.teacher) + 2048 * tensors
    saves = -(-args.steps // args.save_every) if args.save_every else 0
    return one, run_disk_bytes(one, final_model_bytes(trained.policy), args.keep_last, saves)


def size(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def out_of_disk(out, need, what):
    newest = latest(out)
    then = f"the newest complete checkpoint, {newest}, is kept: free some space, then continue with: python " \
           f"train.py --out {out} --resume" if newest else \
        "there is no complete checkpoint yet: free some space, then start the run again"
    return (f"out of disk: {disk_of(out)}, which holds --out {out}, has {size(shutil.disk_usage(out).free)} "
            f"free and {what} needs {size(need)}; the run stopped, {then}")


def check_room_on_all_ranks(out, need, what, rank):
    """Collective, before a save: all ranks raise OutOfDisk if --out's disk has under `need` bytes free."""
    box = [out_of_disk(out, need, what) if rank == 0 and shutil.disk_usage(out).free < need else None]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise OutOfDisk(box[0])


@contextlib.contextmanager
def stop_cleanly_if_the_disk_fills(out, need, what, partial, rank):
    """A save failing for want of space (ENOSPC, or torch's errno-less error) removes `partial`, raises OutOfDisk."""
    try:
        yield
    except (OSError, RuntimeError, dcp.api.CheckpointException) as e:
        if getattr(e, "errno", None) != errno.ENOSPC and shutil.disk_usage(out).free >= need:
            raise
        if rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        raise OutOfDisk(out_of_disk(out, need, what)) from None


def save_checkpoint(args, configuration, step, trained, questions, wandb_id, fingerprints, tokenizer, rank,
                    first_gaps=()):
    """`save` of all the loop needs to go on exactly, once the disk has room (the newest checkpoint's size)."""
    trainer_state = {"scheduler": trained.scheduler.state_dict(), **questions.state(), "wandb_id": wandb_id,
                     "fingerprints": fingerprints, "sampler_gap_first": list(first_gaps)}
    newest = latest(args.out)
    need = folder_bytes(newest) if newest else checkpoint_bytes(trained.policy, trained.teacher)
    check_room_on_all_ranks(args.out, need, "a checkpoint", rank)
    t0 = time.perf_counter()
    with stop_cleanly_if_the_disk_fills(args.out, need, "a checkpoint", step_dir(args.out, step) + ".partial", rank):
        path = save(args.out, step, trained.policy, trained.optimizer, trained.teacher, trainer_state, configuration,
                    tokenizer, args.keep_last)
    if rank == 0:
        tqdm.write(f"saved {path} ({time.perf_counter() - t0:.1f} s)")


def save_final(policy, model_dir, tokenizer, out, rank, preset):
    """Collective: the fp32 policy in OUT/final, gathered to rank 0's CPU only, published atomically with RUN_MARK."""
    from transformers import AutoModelForCausalLM
    final, need = os.path.join(out, "final"), final_model_bytes(policy)
    check_room_on_all_ranks(out, need, "the final model", rank)
    weights = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        with stop_cleanly_if_the_disk_fills(out, need, "the final model", final + ".partial", rank):
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            model.load_state_dict(weights)
            shutil.rmtree(final + ".partial", ignore_errors=True)
            model.save_pretrained(final + ".partial")
            tokenizer.save_pretrained(final + ".partial")
            mark_model_folder(final + ".partial", preset)
            fsync_files(final + ".partial")
            publish(final + ".partial", final)
        print(f"saved {final}")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Write a training checkpoint's policy as a Hugging Face model folder "
                                             "(transformers, vLLM, eval.py and train.py --model load it).")
    ap.add_argument("checkpoint", help="OUT/checkpoints/step_S")
    ap.add_argument("out", help="the model folder to write (must not exist)")
    args = ap.parse_args()
    if not is_checkpoint(args.checkpoint):
        ap.error(f"{args.checkpoint} is not a complete checkpoint folder (OUT/checkpoints/step_S)")
    if os.path.exists(args.out):
        ap.error(f"{args.out} exists; choose another folder")
    print(f"wrote {to_hf(args.checkpoint, args.out)}")
