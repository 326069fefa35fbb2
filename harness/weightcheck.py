"""The weight check after each sync into vLLM: what the engine holds is what the trainer sent, bit for bit.

Each load must send every tensor of the start checkpoint, in its shape; CHECKED_PER_LOAD parameters a load, in turn,
are read back and compared (`checksum`) with what they are made of (checkpoint_sources), and the weights vLLM's CPU
kernels repack are read back through those kernels, a turn of their input columns a load (`kernel_columns`).
"""
import os
import re
from dataclasses import dataclass

import torch

CHECKED_PER_LOAD = 4          # parameters read back and compared after each weight load

# vLLM's fused projections (`packed_modules_mapping`): at tensor parallel 1, their parts concatenated along dim 0
FUSED_PARAMETERS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
INTEGER_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # bytes -> an integer dtype


def checkpoint_sources(engine_name):
    """(the checkpoint's tensors an engine parameter is made of, how): a fused projection's parts, 'concatenated'."""
    module, _, leaf = engine_name.rpartition(".")
    parent, _, last = module.rpartition(".")
    if last in FUSED_PARAMETERS:
        return [".".join(filter(None, (parent, part, leaf))) for part in FUSED_PARAMETERS[last]], "concatenated"
    return [engine_name], "as is"


def composed_shape(engine_name, expected):
    """The shape `engine_name`'s sources make, given the checkpoint's {name: shape}; None if they make none."""
    shapes = [expected.get(s) for s in checkpoint_sources(engine_name)[0]]
    if any(s is None or len(s) == 0 for s in shapes) or len({s[1:] for s in shapes}) > 1:
        return None
    return (sum(s[0] for s in shapes),) + tuple(shapes[0][1:])


@dataclass
class Readback:
    """What VLLMEngine.load_weights can read back here: `checkable` parameters (held as their checkpoint tensors make
    them, in the engine's dtype) in the order the loads check them; `through_kernel` {name: input size}, read through
    kernels; `unreadable` {name: how held}, never compared; the bytes of the checkable ones and of all."""
    checkable: list
    through_kernel: dict
    unreadable: dict
    parameters: int
    readable_bytes: int
    total_bytes: int

    @property
    def loads_to_check_all(self):
        """N: any N loads in a row read back every checkable parameter and every kernel column once."""
        return max(1, -(-len(self.checkable) // CHECKED_PER_LOAD))

    def columns(self, load):
        """{name: (its input size, the columns load number `load` reads back through its kernel)}."""
        n = self.loads_to_check_all
        return {name: (inputs, kernel_columns(inputs, load, n)) for name, inputs in self.through_kernel.items()}

    def report(self):
        """One line: what is read back as it is, through kernels, and not at all (layer numbers as *, with how held)."""
        groups = {}
        for name, how in sorted(self.unreadable.items()):
            groups.setdefault(re.sub(r"\.\d+\.", ".*.", name), []).append(how)
        share, n = self.readable_bytes / max(1, self.total_bytes), self.loads_to_check_all
        line = (f"weight check: {len(self.checkable)} of the engine's {self.parameters} parameters ({100 * share:.1f}% "
                f"of the model's bytes) are read back, {CHECKED_PER_LOAD} a load, each within {n} loads")
        if self.through_kernel:
            line += (f"; {len(self.through_kernel)} repacked for this device's kernels are read back through those "
                     f"kernels, 1/{n} of their input columns a load, each whole within {n} loads")
        if groups:
            line += (f"; {len(self.unreadable)} cannot be read back on this device and are not checked: "
                     + ", ".join(f"{pattern} x{len(hows)} ({hows[0]})" for pattern, hows in groups.items()))
        return line


def readback_plan(expected, layouts, dtype, kernel_verdicts):
    """The Readback of the engine's `layouts` ({name: (shape, dtype name)}) for checkpoint shapes `expected`."""
    checkable, through_kernel, unreadable, readable_bytes, total_bytes = [], {}, {}, 0, 0
    for name, (shape, dtype_name) in sorted(layouts.items()):
        shape, composed = tuple(shape), composed_shape(name, expected)
        nbytes = (torch.Size(composed).numel() * dtype.itemsize if composed is not None else
                  torch.Size(shape).numel() * getattr(torch, dtype_name.removeprefix("torch.")).itemsize)
        total_bytes += nbytes
        if composed is None:
            sources, _ = checkpoint_sources(name)
            unreadable[name] = f"not made of the checkpoint's tensors: {[s for s in sources if s not in expected]}"
        elif shape == composed and dtype_name == str(dtype):
            checkable.append(name)
            readable_bytes += nbytes
        elif name in kernel_verdicts and kernel_verdicts[name] is None:
            through_kernel[name] = composed[1]
        else:
            unreadable[name] = f"held as {shape} {dtype_name.removeprefix('torch.')}, the checkpoint's " \
                               f"{composed} {str(dtype).removeprefix('torch.')}" + \
                               (f", and {kernel_verdicts[name]}" if name in kernel_verdicts else "")
    return Readback(checkable, through_kernel, unreadable, len(layouts), readable_bytes, total_bytes)


def kernel_columns(inputs, load, loads):
    """The input columns load number `load` reads through a kernel: its turn of `loads` blocks of ceil(inputs / loads),
    wrapping round to column 0, so any `loads` loads in a row read every column."""
    width = -(-inputs // loads)
    return [(load % loads * width + k) % inputs for k in range(width)]


def same_bits(engine, sent):
    """Whether kernel-read columns equal, bit for bit once `comparable`, those `sent` (None: not sent)."""
    if engine is None or sent is None or engine.shape != sent.shape or engine.dtype != sent.dtype:
        return False
    integer = INTEGER_OF_WIDTH[sent.element_size()]
    return torch.equal(comparable(engine).view(integer), comparable(sent).view(integer))


def comparable(columns):
    """The columns with -0.0 and subnormals made 0.0: through a kernel, w[i, j] comes back as row i times e_j, w plus
    the row's other weights times ±0.0, so -0.0 may come back 0.0, and a kernel may flush subnormals. Other finite
    weights come back exactly (float32 and bfloat16, vLLM 0.32's oneDNN kernels); a non-finite one makes its row NaN."""
    return torch.where(columns.abs() < torch.finfo(columns.dtype).tiny, torch.zeros_like(columns), columns)


class Sent:
    """What a load sends, taken as it streams through (`watch`): each tensor's shape, the `checksum` of each of
    `summed`, and the `columns` ({name: (input size, indices)}), as the checkpoint's tensors make them in `dtype`."""
    def __init__(self, summed, columns, dtype):
        self.summed, self.wanted, self.dtype = set(summed), columns, dtype
        self.shapes, self.sums, self.columns, self.held = {}, {}, {}, {}
        self.parts = {}                       # checkpoint name -> [(parameter, place among its sources)]
        for name in [*summed, *columns]:
            for place, source in enumerate(checkpoint_sources(name)[0]):
                self.parts.setdefault(source, []).append((name, place))

    def watch(self, named_tensors):
        for name, tensor in named_tensors:
            self.shapes[name] = tuple(tensor.shape)
            for param, place in self.parts.get(name, ()):
                self.take(param, place, tensor)
            yield name, tensor

    def take(self, param, place, tensor):
        """Keep part `place` of `param`; once all came, concatenated along dim 0, its checksum or its columns."""
        sources, tensor = len(checkpoint_sources(param)[0]), tensor.detach()
        part = tensor.to(self.dtype, copy=sources > 1) if param in self.summed else \
            tensor[:, self.wanted[param][1]].to(self.dtype)
        held = self.held.setdefault(param, {})
        held[place] = part
        if len(held) == sources:
            whole = torch.cat([held[k] for k in range(sources)]) if sources > 1 else part
            del self.held[param]
            if param in self.summed:
                self.sums[param] = checksum(whole)
            else:
                self.columns[param] = whole


class WeightCheck:
    """The check of each load into vLLM `llm` (module docstring) against the start checkpoint `model_dir` in `dtype`."""
    def __init__(self, llm, model_dir, dtype):
        self.llm, self.dtype, self.loads = llm, dtype, 0
        self.expected = {name: tuple(f.get_slice(name).get_shape()) for f in safetensors_files(model_dir)
                         for name in f.keys()}       # what every load must send: the start checkpoint's tensors
        layouts = llm.collective_rpc(_parameter_layouts)[0]
        verdicts = self.kernel_verdicts(model_dir, readback_plan(self.expected, layouts, dtype, {}))
        self.readback = readback_plan(self.expected, layouts, dtype, verdicts)
        self.checkable = self.readback.checkable

    def kernel_verdicts(self, model_dir, readback):
        """{name: None, or why not}: whether each unreadable 2-D weight made of checkpoint tensors (repacked for the
        kernels) gives back the start checkpoint's columns through its kernel; a layer without a kernel is left out."""
        shapes = {name: composed_shape(name, self.expected) for name in readback.unreadable if name.endswith(".weight")}
        columns = {name: (shape[1], kernel_columns(shape[1], 0, readback.loads_to_check_all))
                   for name, shape in shapes.items() if shape is not None and len(shape) == 2}
        if not columns:
            return {}
        engine = self.llm.collective_rpc(_kernel_columns, kwargs={"columns": columns, "dtype": self.dtype})[0]
        # the start checkpoint's columns, from its safetensors: each source's, concatenated as the engine's parameter
        wanted = {source: indices for name, (_, indices) in columns.items() for source in checkpoint_sources(name)[0]}
        parts = {name: f.get_slice(name)[:, :max(wanted[name]) + 1][:, wanted[name]].to(self.dtype)
                 for f in safetensors_files(model_dir) for name in f.keys() if name in wanted}
        saved = {name: torch.cat([parts[source] for source in checkpoint_sources(name)[0]]) for name in columns}
        return {name: None if same_bits(engine[name], saved[name]) else
                "its kernel does not give back the start checkpoint's columns" for name in columns
                if engine[name] is not None}

    def sending(self):
        """The `Sent` of this load: its turn of the checkable parameters and of the kernels' columns."""
        start = self.loads * CHECKED_PER_LOAD
        checked = sorted({self.checkable[(start + k) % len(self.checkable)]
                          for k in range(min(CHECKED_PER_LOAD, len(self.checkable)))})
        return Sent(checked, self.readback.columns(self.loads), self.dtype)

    def after_load(self, sent):
        """None, or what is wrong with the load `sent` watched, in words."""
        self.loads += 1
        checked, columns = sorted(sent.summed), sent.wanted
        missing = sorted(n for n in self.expected if n not in sent.shapes)
        reshaped = sorted(n for n in self.expected if n in sent.shapes and sent.shapes[n] != self.expected[n])
        engine_sums = self.llm.collective_rpc(_checksums, kwargs={"names": checked})[0]
        engine_columns = {} if not columns else \
            self.llm.collective_rpc(_kernel_columns, kwargs={"columns": columns, "dtype": self.dtype})[0]
        differ = sorted([n for n in checked if engine_sums[n] != sent.sums.get(n)] +
                        [n for n in columns if not same_bits(engine_columns[n], sent.columns.get(n))])
        problems = [f"{len(missing)} of the model's {len(self.expected)} tensors were not sent ({missing[:3]})"] * \
            bool(missing)
        problems += [f"{reshaped[:3]} came in another shape"] * bool(reshaped)
        problems += [f"the engine's {differ[:3]} differ from the trainer's after the load"] * bool(differ)
        return "; ".join(problems) or None


def safetensors_files(model_dir):
    """Each of a Hugging Face folder's safetensors files in turn, open (its tensors read on demand)."""
    import glob
    from safetensors import safe_open
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            yield f


def checksum(tensor, chunk=2**22):
    """An exact fingerprint of a tensor's bits: the sum of each element's bit pattern times a weight of its place (a
    permutation changes it), in wrapping int64, which no summation order changes. In chunks, on the tensor's device."""
    flat = tensor.detach().contiguous().view(-1)
    bits = flat.view(INTEGER_OF_WIDTH[flat.element_size()])
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for begin in range(0, bits.numel(), chunk):
        part = bits[begin:begin + chunk].to(torch.int64)
        weights = torch.arange(begin, begin + part.numel(), device=flat.device, dtype=torch.int64) % 65521 + 1
        total += (part * weights).sum()
    return tuple(tensor.shape), int(total)


def _checksums(worker, names):
    """Runs in the vLLM worker: `checksum` of each named parameter."""
    params = dict(worker.model_runner.get_model().named_parameters())
    return {n: checksum(params[n]) for n in names}


def _parameter_layouts(worker):
    """Runs in the vLLM worker (collective_rpc): {name: (shape, dtype name)} of the engine's parameters."""
    return {n: (tuple(p.shape), str(p.dtype)) for n, p in worker.model_runner.get_model().named_parameters()}


@torch.no_grad()
def _kernel_columns(worker, columns, dtype):
    """Runs in the vLLM worker: {name: its `columns` [outputs, len(indices)] in `dtype`}, the layer's product
    (quant_method.apply, no bias) with the unit vectors e_j; None where the layer has no quant_method."""
    model, out = worker.model_runner.get_model(), {}
    for name, (inputs, indices) in columns.items():
        layer = model.get_submodule(name.rpartition(".")[0])
        if getattr(layer, "quant_method", None) is None:
            out[name] = None
            continue
        device = layer.weight.device
        units = torch.zeros(len(indices), inputs, dtype=dtype, device=device)
        units[torch.arange(len(indices), device=device), torch.tensor(indices, device=device)] = 1
        out[name] = layer.quant_method.apply(layer, units).t().to("cpu", dtype)
    return out
