"""The weight check after each sync into vLLM: what the engine holds is what the trainer sent, bit for bit.

Every tensor of the start checkpoint must be sent, in its shape, and a few parameters each load are read back from
the engine and compared bit for bit with what was sent, so that every readable parameter is read back within a few
loads. vLLM's CPU kernels repack the linear layers' weights and leave an empty tensor in their place: those are read
back through the kernels themselves, a turn of their input columns each load (`kernel_columns`). `Readback.report`
is the run's line on what is checked, and what cannot be.
"""
import os
from dataclasses import dataclass

import torch


CHECKED_PER_LOAD = 4          # parameters read back and compared after each weight load

# vLLM's fused projections (the `packed_modules_mapping` of its Llama and Qwen models): at tensor parallel 1
# each is its parts' checkpoint tensors concatenated along the output dimension (dim 0), in this order
FUSED_PARAMETERS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def checkpoint_sources(engine_name):
    """(the checkpoint's tensor names an engine parameter is made of, how) at tensor parallel 1: a fused
    projection (FUSED_PARAMETERS) is its parts concatenated along dim 0, so
    'model.layers.0.self_attn.qkv_proj.weight' -> (['model.layers.0.self_attn.q_proj.weight',
    'model.layers.0.self_attn.k_proj.weight', 'model.layers.0.self_attn.v_proj.weight'], 'concatenated');
    any other parameter is the checkpoint's tensor of its own name: ([engine_name], 'as is')."""
    module, _, leaf = engine_name.rpartition(".")
    parent, _, last = module.rpartition(".")
    if last in FUSED_PARAMETERS:
        return [".".join(filter(None, (parent, part, leaf))) for part in FUSED_PARAMETERS[last]], "concatenated"
    return [engine_name], "as is"


def composed_shape(engine_name, expected):
    """The shape of what `engine_name` is made of (checkpoint_sources) given the checkpoint's {name: shape};
    None when a part is not in the checkpoint or the parts do not concatenate."""
    sources, _ = checkpoint_sources(engine_name)
    shapes = [expected.get(s) for s in sources]
    if any(s is None or len(s) == 0 for s in shapes) or len({s[1:] for s in shapes}) > 1:
        return None
    return (sum(s[0] for s in shapes),) + tuple(shapes[0][1:])


@dataclass
class Readback:
    """What VLLMEngine.load_weights can read back on this device: `checkable`, the engine's parameters held
    as the checkpoint's tensors make them (checkpoint_sources) in the engine's dtype, in the order the loads
    take them, CHECKED_PER_LOAD a load; `through_kernel`, {name: its input size} of the weights the engine's
    kernels repack, read back through those kernels (`kernel_columns`), some of their columns every load;
    `unreadable`, {name: how the engine holds it instead}, never compared; the bytes of the checkable ones as
    the checkpoint makes them, and of all."""
    checkable: list
    through_kernel: dict
    unreadable: dict
    parameters: int
    readable_bytes: int
    total_bytes: int

    @property
    def loads_to_check_all(self):
        """N: within the first N loads, and within any N loads in a row, every checkable parameter is read
        back once, and every column of each weight read through its kernel."""
        return max(1, -(-len(self.checkable) // CHECKED_PER_LOAD))

    def columns(self, load):
        """{name: (its input size, the input columns load number `load` reads back through its kernel)}."""
        n = self.loads_to_check_all
        return {name: (inputs, kernel_columns(inputs, load, n)) for name, inputs in self.through_kernel.items()}

    def report(self):
        """One line: how many of the engine's parameters, and what share of the model's bytes, are read back
        here as they are, how many through their kernel, and which are not read back (layer numbers replaced by
        *, with their count and how the engine holds them)."""
        import re
        groups = {}
        for name, how in sorted(self.unreadable.items()):
            groups.setdefault(re.sub(r"\.\d+\.", ".*.", name), []).append(how)
        share, n = self.readable_bytes / max(1, self.total_bytes), self.loads_to_check_all
        line = (f"weight check: {len(self.checkable)} of the engine's {self.parameters} parameters "
                f"({100 * share:.1f}% of the model's bytes) are read back, {CHECKED_PER_LOAD} a load, each within "
                f"{n} loads")
        if self.through_kernel:
            line += (f"; {len(self.through_kernel)} repacked for this device's kernels are read back through those "
                     f"kernels, 1/{n} of their input columns a load, each whole within {n} loads")
        if groups:
            line += (f"; {len(self.unreadable)} cannot be read back on this device and are not checked: "
                     + ", ".join(f"{pattern} x{len(hows)} ({hows[0]})" for pattern, hows in groups.items()))
        return line


def readback_plan(expected, layouts, dtype, kernel_verdicts):
    """The Readback of an engine whose parameters are `layouts` ({name: (shape, dtype name)}, as
    _parameter_layouts reads them), for the checkpoint's {name: shape} `expected`, in `dtype` (the torch dtype
    the engine was asked for). A parameter is checkable when the engine holds it in the shape its checkpoint
    tensors make (composed_shape) and in `dtype`. Otherwise (vLLM's CPU kernels, for one, repack linear
    weights and leave an empty tensor in the parameter's place) it is read through its kernel when
    `kernel_verdicts` ({name: None, or why its kernel does not give its columns back}: VLLMEngine.kernel_verdicts)
    says its kernel gives back its columns, and unreadable, with how it is held (and why not through its kernel),
    when not."""
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


def kernel_candidates(readback, expected):
    """The unreadable parameters that a layer's kernel might give back: 2-D weights (output x input) made of
    the checkpoint's tensors, {name: their input size}."""
    shapes = {name: composed_shape(name, expected) for name in readback.unreadable if name.endswith(".weight")}
    return {name: shape[1] for name, shape in shapes.items() if shape is not None and len(shape) == 2}


def kernel_columns(inputs, load, loads):
    """The input columns (of `inputs`) that load number `load` reads back through a kernel: the load's turn of
    `loads` blocks of ceil(inputs / loads) columns, the last wrapping round to column 0, so that any `loads`
    loads in a row read every column."""
    width = -(-inputs // loads)
    return [(load % loads * width + k) % inputs for k in range(width)]


def same_bits(engine, sent):
    """Whether the columns read through a kernel equal, bit for bit, the columns sent (`sent`: None when nothing
    was sent for them), once both are `comparable`."""
    if engine is None or sent is None or engine.shape != sent.shape or engine.dtype != sent.dtype:
        return False
    integer = INTEGER_OF_WIDTH[sent.element_size()]
    return torch.equal(comparable(engine).view(integer), comparable(sent).view(integer))


def comparable(columns):
    """The columns with -0.0 and subnormal values made 0.0, on both sides of the comparison. Read through a
    kernel, the weight w at (i, j) comes back as the dot product of row i with the unit vector e_j: w plus the
    row's other weights times 0, each +0.0 or -0.0, so that a -0.0 weight may come back as 0.0; and a kernel may
    flush subnormals to 0.0. Any other finite weight comes back exactly, one non-zero term per sum (measured in
    float32 and bfloat16 on vLLM 0.32's oneDNN kernels); a non-finite one makes its whole row NaN."""
    return torch.where(columns.abs() < torch.finfo(columns.dtype).tiny, torch.zeros_like(columns), columns)


class Sent:
    """What a load sends, taken as it streams through (`watch`): each tensor's shape; the `checksum` of each
    parameter in `summed`, and the columns of each in `columns` ({name: (input size, column indices)}), of what
    the checkpoint's tensors make it (checkpoint_sources) in `dtype`. Of the tensors, only the parts of a fused
    parameter are kept, until its last part came, and the columns."""
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
        """Keep what `param` needs of its source number `place`; once every source came, its checksum or its
        columns, the parts concatenated along dim 0."""
        sources = len(checkpoint_sources(param)[0])
        tensor = tensor.detach()
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
    """The check of every weight load into a vLLM engine `llm` (its `collective_rpc`), against the start checkpoint
    in `model_dir`, in `dtype`. At the start: which parameters can be read back (`readback_plan`), and of the weights
    the engine's kernels repack, whether their kernel gives back the checkpoint's columns (`kernel_verdicts`). At
    each load (`sending`, then `after_load`): every tensor of the start checkpoint sent, in its shape; CHECKED_PER_LOAD
    of the checkable parameters, the next few in turn, equal bit for bit (`checksum`) to what they are made of
    (checkpoint_sources: a fused qkv_proj the q, k and v tensors sent, concatenated); and every weight read through its
    kernel, the load's turn of its input columns (Readback.columns), equal bit for bit (`same_bits`) to those columns
    of what it is made of. Only what is compared is kept of the tensors sent (`Sent`)."""
    def __init__(self, llm, model_dir, dtype):
        self.llm, self.dtype, self.loads = llm, dtype, 0
        self.expected = checkpoint_shapes(model_dir)     # what every load must send: the start checkpoint's tensors
        layouts = llm.collective_rpc(_parameter_layouts)[0]
        verdicts = self.kernel_verdicts(model_dir, readback_plan(self.expected, layouts, dtype, {}))
        self.readback = readback_plan(self.expected, layouts, dtype, verdicts)
        self.checkable = self.readback.checkable

    def kernel_verdicts(self, model_dir, readback):
        """The columns the first load will read of each weight the engine's kernels repack (`kernel_candidates` of the
        first `readback`, which reads none through a kernel), read through its layer's kernel, must equal the start
        checkpoint's: {name: None where they do, or why not}; a parameter whose layer has no kernel to apply is left
        out (unreadable, as it is held)."""
        columns = {name: (inputs, kernel_columns(inputs, 0, readback.loads_to_check_all))
                   for name, inputs in kernel_candidates(readback, self.expected).items()}
        if not columns:
            return {}
        engine = self.llm.collective_rpc(_kernel_columns, kwargs={"columns": columns, "dtype": self.dtype})[0]
        saved = checkpoint_columns(model_dir, columns, self.dtype)
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


def checkpoint_shapes(model_dir):
    """{name: shape} of the tensors in a Hugging Face folder's safetensors files (headers only)."""
    import glob
    from safetensors import safe_open
    shapes = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return shapes


def checkpoint_columns(model_dir, columns, dtype):
    """{engine parameter: its columns as the checkpoint in model_dir makes it (checkpoint_sources), in `dtype`},
    for `columns` {name: (input size, column indices)}: each part's columns up to the last one wanted, read
    from its safetensors file, then picked and concatenated along dim 0."""
    import glob
    from safetensors import safe_open
    wanted = {source: indices for name, (_, indices) in columns.items() for source in checkpoint_sources(name)[0]}
    parts = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            parts.update({name: f.get_slice(name)[:, :max(wanted[name]) + 1][:, wanted[name]].to(dtype)
                          for name in f.keys() if name in wanted})
    return {name: torch.cat([parts[source] for source in checkpoint_sources(name)[0]]) for name in columns}


INTEGER_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checksum(tensor, chunk=2**22):
    """An exact fingerprint of a tensor's bits: the sum of each element's bit pattern times a weight that
    depends on its place (so a permutation changes it), in wrapping 64-bit integer arithmetic, whose sums do
    not depend on the order they are taken in. Computed in chunks on the tensor's device."""
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
    """Runs in the vLLM worker: {name: the named weight's columns, [outputs, len(indices)] in `dtype`, read through
    its layer's kernel} for `columns` {name: (input size, column indices)}: the layer's own product
    (quant_method.apply, as its forward, without the bias) of the unit vectors e_j of those columns, whose
    results are the columns W e_j (`comparable` says how exactly); None for a parameter whose layer has none."""
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
