"""What the jobs run on, from one setting: `vm.accelerator` (auto: the stack's `tpu-rl:machineType`).

From it come the chips JAX must see and their kind (the environment check), libtpu's TPU_ variables for
the jobs that run on the TPU (`tpu: true`: train), train's `chips_per_vm` (`${chips}`), and whether the
run fits the chips' memory. A v6e-4 stack therefore needs no edit of the job files; a job file that says
otherwise than the stack is refused in one line before anything is made or started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from infra import topology

from .schema import MaxText

AUTO, HOST, CPU = "auto", "host", "cpu"
DEFAULT = "v6e-8"  # tpu-rl:machineType's default (ct6e-standard-8t): what `auto` is without a stack to read
# rl.yml's own values (0.2.3 to 0.2.5) where a job does not set them: the weights' dtype, and the share of each
# chip's HBM that vLLM may fill, its own copy of the weights and its KV cache with what the trainer holds.
RL_DEFAULTS = {"weight_dtype": "bfloat16", "hbm_utilization_vllm": "0.72"}
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# On one host, trainer and sampler share every chip (chips_per_vm = chips): the actor's weights, its two Adam
# moments (in the weights' dtype), its gradients, the reference model and vLLM's copy: six copies of the weights.
COPIES = 6
LLAMA_BLOCKS = ("llama2", "mistral")  # decoder blocks whose parameter count `parameters` knows


@dataclass(frozen=True)
class Accelerator:
    """The chips the jobs run on, as one setting derives them."""

    name: str  # v6e-8, host (the host's own TPU environment) or cpu (no TPU: JAX on the CPU)
    chips: int
    device_kind: str  # JAX's device_kind of each chip; "" for cpu
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # libtpu's, for `tpu: true` jobs
    machine_type: str = ""  # the Compute Engine machine type of a v6e host
    source: str = "vm.accelerator"  # what chose it, for the messages

    @property
    def hbm_gb(self) -> float:
        """All chips' HBM together (0 where it is not known: host, cpu)."""
        return self.chips * topology.HBM_GB_PER_CHIP if self.machine_type else 0.0

    def line(self) -> str:
        """One line for `fab plan`."""
        if self.name == CPU:
            return f"cpu (no TPU: JAX on the CPU; {self.source})"
        if self.name == HOST:
            return f"the host's own TPU environment: {self.chips} x {self.device_kind} ({self.source})"
        variables = " ".join(f"{k}={v}" for k, v in self.env.items() if k in SLICE_VARIABLES)
        return f"{self.name}: {self.machine_type}, {self.chips} x {self.device_kind} ({self.source}); {variables}"


SLICE_VARIABLES = ("TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")


def _slice_env(host: topology.Host) -> dict[str, str]:
    """libtpu's variables for one v6e VM, as the guide sets them for a ct6e-standard-8t."""
    return {
        "TPU_ACCELERATOR_TYPE": host.accelerator,
        "TPU_WORKER_ID": "0",
        "TPU_NAME": "${hostname}",  # looked up on the VM
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "TPU_TOPOLOGY": host.topology,
        "TPU_CHIPS_PER_HOST_BOUNDS": host.chips_per_host_bounds,
        "TPU_HOST_BOUNDS": "1,1,1",
    }


def derive(setting: str, chips: int | None, kind: str | None, machine_type: str | None) -> tuple[Accelerator, str]:
    """The accelerator for vm.accelerator `setting` (and vm.chips, vm.chip_kind, for `host` alone) on a stack whose
    machine type is `machine_type` (None: not known, no stack read); and what is wrong ("" when nothing)."""
    stack = topology.of_machine_type(machine_type) if machine_type else None
    if machine_type and stack is None:
        return _host(DEFAULT, "the default"), f"the stack's tpu-rl:machineType {machine_type} is not a v6e VM fab knows"
    if setting in (HOST, CPU):
        if setting == CPU and (chips or kind):
            return Accelerator(CPU, 0, ""), "vm.chips and vm.chip_kind are for vm.accelerator: host; cpu has none"
        if setting == HOST and (not chips or not kind):
            why = "vm.accelerator: host needs vm.chips (how many) and vm.chip_kind (JAX's device_kind) to check"
            return Accelerator(HOST, chips or 0, kind or ""), why
        chosen = Accelerator(setting, chips or 0, kind or "", source="vm.accelerator")
        if stack is not None and (setting == CPU or (chips, kind) != (stack.chips, topology.DEVICE_KIND)):
            has = "no TPU" if setting == CPU else f"{chips} x {kind}"
            why = (
                f"{setting} ({has}), but the stack's VM is {stack.machine_type}: {stack.chips} x "
                f"{topology.DEVICE_KIND} ({stack.accelerator}); set vm.accelerator: auto (the stack's)"
            )
            return chosen, why
        return chosen, ""
    if chips is not None or kind is not None:
        why = (
            f"vm.chips and vm.chip_kind come from vm.accelerator ({setting}); remove them, or set vm.accelerator: host"
        )
        return _host(setting if setting != AUTO else DEFAULT, "vm.accelerator"), why
    if setting == AUTO:
        if stack is None:
            return _host(DEFAULT, "tpu-rl:machineType's default; no stack was read"), ""
        return _host(stack.accelerator, f"the stack's tpu-rl:machineType {stack.machine_type}"), ""
    chosen = _host(setting, "vm.accelerator")
    if stack is not None and stack.accelerator != setting:
        why = (
            f"{setting}, but the stack's VM is {stack.machine_type} ({stack.accelerator}): set vm.accelerator: auto "
            f"(the stack's), or tpu-rl:machineType {chosen.machine_type}"
        )
        return chosen, why
    return chosen, ""


def _host(name: str, source: str) -> Accelerator:
    host = topology.HOSTS[name]
    env = MappingProxyType(_slice_env(host))
    return Accelerator(name, host.chips, topology.DEVICE_KIND, env, host.machine_type, source)


def parameters(model: dict) -> int | None:
    """A Llama-style model's parameters, from MaxText's model config (None for another architecture)."""
    needed = ("base_emb_dim", "base_mlp_dim", "base_num_decoder_layers", "base_num_kv_heads", "base_num_query_heads")
    if model.get("decoder_block") not in LLAMA_BLOCKS or not all(isinstance(model.get(k), int) for k in needed):
        return None
    width, mlp, layers = model["base_emb_dim"], model["base_mlp_dim"], model["base_num_decoder_layers"]
    head = model.get("head_dim") or width // model["base_num_query_heads"]
    attention = width * head * (2 * model["base_num_query_heads"] + 2 * model["base_num_kv_heads"])
    embeddings = model["vocab_size"] * width * (1 if model.get("logits_via_embedding") else 2)
    return embeddings + layers * (attention + 3 * width * mlp + 2 * width) + width


def parameters_of(maxtext: MaxText, args: dict[str, str]) -> int | None:
    """The parameters of a job's model: its MaxText model config, with the job's own dimensions
    (override_model_config); None for an architecture `parameters` does not know."""
    model = dict(maxtext.model_keys(args.get("model_name", "").replace("-Instruct", "")))
    for key in ("base_emb_dim", "base_mlp_dim", "base_num_decoder_layers", "base_num_kv_heads",
                "base_num_query_heads", "head_dim", "vocab_size"):  # fmt: skip
        if args.get(key, "").isdigit():
            model[key] = int(args[key])
    return parameters(model)


def fit_problem(accelerator: Accelerator, maxtext: MaxText, module: str, args: dict[str, str]) -> str:
    """Why an RL run of this model cannot fit these chips' HBM ("" when it can, or the numbers are not known):
    six copies of the weights (COPIES) must fit in vLLM's share of the HBM, with room left for its KV cache."""
    count = parameters_of(maxtext, args)
    dtype = args.get("weight_dtype") or maxtext.value(args, module, "weight_dtype") or RL_DEFAULTS["weight_dtype"]
    share = args.get("hbm_utilization_vllm") or RL_DEFAULTS["hbm_utilization_vllm"]
    try:
        share_value = float(share)
    except ValueError:
        return ""
    if not accelerator.hbm_gb or count is None or dtype not in BYTES or not math.isfinite(share_value):
        return ""
    need = COPIES * count * BYTES[dtype] / 1e9
    room = share_value * accelerator.hbm_gb
    if need < room:
        return ""
    fits = [h.accelerator for h in topology.HOSTS.values() if need < share_value * h.chips * topology.HBM_GB_PER_CHIP]
    advice = (
        f"use {fits[0]} (tpu-rl:machineType {topology.HOSTS[fits[0]].machine_type})" if fits else "no v6e VM holds it"
    )
    return (
        f"{accelerator.name} ({accelerator.source}: {accelerator.chips} x {topology.HBM_GB_PER_CHIP} GB HBM) cannot "
        f"hold this GRPO run: "
        f"{count / 1e9:.1f}B parameters in {dtype} x {COPIES} (the actor, its two Adam moments, its gradients, the "
        f"reference model, vLLM's copy) is {need:.0f} GB, more than vLLM's share of the HBM "
        f"(hbm_utilization_vllm {share_value:g}: {room:.0f} GB), before any KV cache; {advice}"
    )
