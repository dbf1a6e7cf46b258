"""Which megatron-core options this machine's kernels can honour (torch-free: the launch check runs before torch).

One table, `OPTIONS`: each TransformerConfig option (or layer-spec choice) that needs more than plain torch, the
flag that sets it, what it needs and how that is probed. Probes never import a package: `importlib.util.find_spec`
for a module (Apex's compiled extensions are top-level modules: `fused_weight_gradient_mlp_cuda`, ...) and the
installed distribution's version for TransformerEngine (`importlib.metadata`, as megatron-core's
`is_te_min_version` reads it), so nothing initialises CUDA.

`resolve(args, cuda)` applies the table: an option left at its default is on only when its kernel is there (on a
GPU without TransformerEngine / Apex the defaults build, measured on an H100 in issue #25); an option the user set
(on the command line, through a --config file or in --megatron-config-path's YAML) that cannot be honoured is an
error naming the flag and the missing package, all of them in one message. Without CUDA every kernel is off (the
CPU run builds megatron-core's local spec; validation already warns about CUDA-only flags there).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from dataclasses import dataclass, field

TE = "transformer_engine"
TE_PIP = "transformer-engine[pytorch]"
APEX_EXT = "Apex built with --cpp_ext --cuda_ext"


def have(module: str) -> bool:
    """A top-level module is importable (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def te_version() -> tuple | None:
    """TransformerEngine's version as a tuple of ints; None when it is not importable; (0,) when importable but
    of unknown version (no distribution metadata)."""
    if not have(TE):
        return None
    for dist in ("transformer-engine", "transformer_engine", "transformer-engine-torch"):
        try:
            text = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        parts = []
        for p in text.split("+")[0].split("."):
            if not p.isdigit():
                break
            parts.append(int(p))
        return tuple(parts) or (0,)
    return (0,)


def c_compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@dataclass
class Stack:
    """What the probes found, and the layer spec chosen from it."""
    cuda: bool
    te: tuple | None = None
    te_spec: bool = False
    normalization: str = "RMSNorm"
    rotary_interleaved: bool = False

    def te_at_least(self, *version) -> bool:
        return self.te is not None and (self.te == (0,) or self.te >= version)


def _te(minimum=(1, 4)):
    def probe(s: Stack):
        return s.te_at_least(*minimum)
    return probe


def _compiled(s: Stack) -> bool:  # megatron-core's jit_fuser is torch.compile: on CUDA that is triton + a C compiler
    return have("triton") and c_compiler() is not None


def _rope(s: Stack) -> bool:
    return s.te_at_least(2, 3) if s.rotary_interleaved else s.te_at_least(1, 4)


def _softmax(s: Stack) -> bool:
    return all(have(m) for m in ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda",
                                 "scaled_softmax_cuda"))


def _persist_norm(s: Stack) -> bool:  # only Apex's FusedLayerNorm (local spec, LayerNorm) reads it
    return not s.te_spec and s.normalization == "LayerNorm" and have("apex") and have("fast_layer_norm")


def _sp_norms(s: Stack) -> bool:  # the local spec's torch norms refuse sequence parallelism; Apex's LayerNorm not
    return s.te_spec or (s.normalization == "LayerNorm" and have("apex"))


def _grouped_gemm(s: Stack) -> bool:
    return (s.te_spec and s.te_at_least(1, 7)) or have("grouped_gemm")


@dataclass(frozen=True)
class Option:
    field: str      # TransformerConfig field (what megatron-core reads)
    dest: str       # args dest (what the user sets)
    flag: str       # how the user turns it off (a default-on option) or on (a default-off one)
    needs: str      # what it needs, as the error says it
    probe: object   # Stack -> bool


OPTIONS = (
    Option("apply_rope_fusion", "apply_rope_fusion", "--no-rope-fusion",
           f"TransformerEngine >= 1.4 (>= 2.3 with --rotary-interleaved): pip install '{TE_PIP}'", _rope),
    Option("gradient_accumulation_fusion", "gradient_accumulation_fusion", "--no-gradient-accumulation-fusion",
           f"the fused_weight_gradient_mlp_cuda extension ({APEX_EXT})",
           lambda s: have("fused_weight_gradient_mlp_cuda")),
    Option("masked_softmax_fusion", "masked_softmax_fusion", "--no-masked-softmax-fusion",
           "the scaled_*masked_softmax_cuda extensions (Megatron-LM's fused kernels or Apex)", _softmax),
    Option("bias_activation_fusion", "bias_swiglu_fusion", "--no-bias-swiglu-fusion",
           "torch.compile on CUDA: the triton package and a C compiler", _compiled),
    Option("bias_dropout_fusion", "bias_dropout_fusion", "--no-bias-dropout-fusion",
           "torch.compile on CUDA: the triton package and a C compiler", _compiled),
    Option("moe_grouped_gemm", "moe_grouped_gemm", "--moe-grouped-gemm",
           "TransformerEngine >= 1.7 with --transformer-impl transformer_engine, or the grouped_gemm package",
           _grouped_gemm),
    Option("moe_permute_fusion", "moe_permute_fusion", "--moe-permute-fusion",
           f"TransformerEngine >= 2.1: pip install '{TE_PIP}'", _te((2, 1))),
    Option("sequence_parallel", "sequence_parallel", "--sequence-parallel",
           f"TransformerEngine's layers (the local spec's torch norms refuse it; Apex's LayerNorm accepts it): "
           f"pip install '{TE_PIP}'", _sp_norms),
)
# no flag: Megatron-LM's --no-persist-layer-norm is not a flag here, so it is only ever a default
PERSIST_LAYER_NORM = Option("persist_layer_norm", "persist_layer_norm", "", "Apex's fast_layer_norm extension",
                            _persist_norm)
ATTENTION_NEEDS = {"flash": ("TransformerEngine and flash-attn", lambda: have(TE) and have("flash_attn")),
                   "fused": ("TransformerEngine", lambda: have(TE)), "unfused": ("TransformerEngine", lambda: have(TE))}


@dataclass
class Resolution:
    te_spec: bool
    fields: dict = field(default_factory=dict)     # TransformerConfig field -> value
    errors: list = field(default_factory=list)     # explicit requests that cannot be honoured
    turned_off: list = field(default_factory=list)  # defaults switched off for want of a kernel (dest names)


def explicit(args, dest: str) -> bool:
    """The user set `dest`: on the command line (a --config file's keys become flags there too) or in the YAML of
    --megatron-config-path for this role (or any role, on the shared namespace)."""
    if dest in args.cli_dests:
        return True
    overrides = args.megatron_role_overrides or {}
    role = vars(args).get("role")
    roles = [role] if role in overrides else ([] if role else list(overrides))
    return any(dest in overrides[r] for r in roles)


def _spec_choice(args, cuda: bool, errors: list) -> bool:
    """TransformerEngine's layer spec or megatron-core's local one (--transformer-impl, --attention-backend)."""
    impl, backend = args.transformer_impl, args.attention_backend
    if not cuda:
        return False
    te = have(TE)
    if backend == "local":  # megatron-core's own attention: the local spec (TE's attention would get no backend)
        if impl == "transformer_engine" and explicit(args, "transformer_impl"):
            errors.append("--attention-backend local runs megatron-core's own attention, which the "
                          "--transformer-impl transformer_engine spec does not use; pick one of the two")
        return False
    if backend in ATTENTION_NEEDS and explicit(args, "attention_backend"):
        what, ok = ATTENTION_NEEDS[backend]
        if not ok():
            errors.append(f"--attention-backend {backend} needs {what}, which this machine lacks "
                          f"({_missing(backend)}); install it or use --attention-backend auto")
    if impl == "transformer_engine":
        if not te and explicit(args, "transformer_impl"):
            errors.append(f"--transformer-impl transformer_engine needs TransformerEngine, which is not installed "
                          f"(pip install '{TE_PIP}'); use --transformer-impl local or leave the flag out")
        return te
    return False


def _missing(backend: str) -> str:
    names = [TE] + (["flash_attn"] if backend == "flash" else [])
    return ", ".join(f"{n} not importable" for n in names if not have(n)) or "?"


def resolve(args, cuda: bool) -> Resolution:
    """Spec and kernel options for this machine; see the module docstring."""
    errors = []
    stack = Stack(cuda=cuda, te=te_version() if cuda else None, normalization=args.normalization,
                  rotary_interleaved=bool(args.rotary_interleaved))
    stack.te_spec = _spec_choice(args, cuda, errors)
    out = Resolution(te_spec=stack.te_spec, errors=errors)
    for opt in OPTIONS:
        wanted = bool(getattr(args, opt.dest)) and (args.num_experts or not opt.dest.startswith("moe_"))
        ok = cuda and bool(opt.probe(stack))
        if wanted and not ok and cuda:
            if explicit(args, opt.dest):
                errors.append(f"{_asked(args, opt)} needs {opt.needs}, which this machine lacks; install it or "
                              + (f"pass {opt.flag}" if opt.flag.startswith("--no-") else f"drop {opt.flag}"))
            else:
                out.turned_off.append(opt.dest)
        out.fields[opt.field] = bool(wanted and ok)
    out.fields["persist_layer_norm"] = cuda and bool(PERSIST_LAYER_NORM.probe(stack))
    if args.fp8_format:  # TransformerEngine's FP8 autocast around each layer (megatron-core's get_fp8_context)
        errors += fp8_problems(args, cuda, stack)
        out.fields.update(fp8=args.fp8_format, fp8_recipe=args.fp8_recipe, fp8_param=bool(args.fp8_param_gather))
    if not cuda and args.sequence_parallel:  # the local spec's torch norms refuse it
        errors.append("--sequence-parallel needs TransformerEngine on CUDA; drop it for CPU runs")
    return out


# the TransformerEngine a recipe needs (megatron-core's own is_te_min_version checks for each)
FP8_RECIPE_TE = {"delayed": (1, 0), "tensorwise": (2, 2), "mxfp8": (2, 1), "blockwise": (2, 3)}


def fp8_problems(args, cuda: bool, stack: Stack) -> list:
    """--fp8-format / --fp8-recipe against this machine's stack (the GPU's compute capability is
    transformer_config.py's, with torch)."""
    asked = f"--fp8-format {args.fp8_format} --fp8-recipe {args.fp8_recipe}"
    if not cuda:
        return [f"{asked} needs TransformerEngine on a CUDA GPU with FP8; none is visible: drop the FP8 flags"]
    if not stack.te_spec:
        why = "not installed" if not have(TE) else "not chosen (--transformer-impl local / --attention-backend local)"
        return [f"{asked} runs in TransformerEngine's layers, and TransformerEngine's spec is {why}: pip install "
                f"'{TE_PIP}' and keep --transformer-impl transformer_engine, or drop the FP8 flags"]
    need = FP8_RECIPE_TE[args.fp8_recipe]
    if not stack.te_at_least(*need):
        return [f"--fp8-recipe {args.fp8_recipe} needs TransformerEngine >= {'.'.join(map(str, need))} (found "
                f"{'.'.join(map(str, stack.te))}): upgrade it or use --fp8-recipe delayed"]
    return []


def _asked(args, opt: Option) -> str:
    """How the user asked for it, in their own words."""
    if opt.dest in args.cli_dests:
        return f"{opt.flag} (command line)" if not opt.flag.startswith("--no-") else \
            f"{opt.dest} (set on the command line)"
    return f"'{opt.dest}: true' in {args.megatron_config_path}"


def check(args, cuda: bool) -> Resolution:
    """resolve(), raising one ValueError that lists every request this machine cannot honour."""
    res = resolve(args, cuda)
    if len(res.errors) == 1:
        raise ValueError(res.errors[0])
    if res.errors:
        raise ValueError(f"{len(res.errors)} kernel options cannot be honoured here:\n"
                         + "\n".join(f"  - {e}" for e in res.errors))
    return res


def local_cp_problems(args) -> list[str]:
    """What the local spec's all-gather CP attention (cp_attention.py) cannot run with --context-parallel-size > 1,
    one entry each (TransformerEngine's CP attention runs both)."""
    cp, problems = args.context_parallel_size, []
    from slime_like.config.sparse_attention import sparse_attention_checkpoint

    if args.multi_latent_attention and not sparse_attention_checkpoint(args):
        # DeepSeek-V3.2 / GLM-5 run their own CP attention (dsa.py); dense MLA needs TE's
        problems.append(f"--context-parallel-size {cp} with multi-latent attention needs TransformerEngine's CP "
                        "attention (not importable here)")
    if args.attention_dropout:
        problems.append(f"--context-parallel-size {cp} without TransformerEngine: the all-gather CP attention has no "
                        "dropout; use --attention-dropout 0")
    return problems


def launch_check(args) -> tuple:
    """(errors, note) for the Megatron trainers of this run, checked on the driver before Ray starts when this
    machine shows a CUDA GPU (a CPU-only head node leaves it to the trainers): what they would refuse at build, one
    entry per problem, and one line saying which spec they build and which default fusions are off for want of a
    kernel."""
    from slime_like.config.cluster import cuda_visible
    from slime_like.config.role_overrides import apply_role

    if args.train_backend != "megatron" or not cuda_visible():
        return [], ""
    errors, off = [], []
    for role in ("actor", "critic") if args.use_critic else ("actor",):
        role_args = apply_role(args, role)
        res = resolve(role_args, cuda=True)
        cp_errors = local_cp_problems(role_args) if role_args.context_parallel_size > 1 and not res.te_spec else []
        errors += [e for e in res.errors + cp_errors if e not in errors]
        off += [d for d in res.turned_off if d not in off]
        te_spec = res.te_spec if role == "actor" else te_spec
    spec = "TransformerEngine's layer spec" if te_spec else \
        f"megatron-core's local spec ({TE} {'not importable' if not have(TE) else 'not asked for'})"
    note = f"Megatron trainer: {spec}" + (f"; default fusions off for want of their kernels: {', '.join(off)} "
                                          "(backends/megatron/kernels.py, docs/gpu.md)" if off else "")
    return errors, note
