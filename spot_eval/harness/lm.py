"""`lm_eval --model spot`: every request decoded draft-free and by each method, side by side.

The model returns the draft-free text (the target's own output, which lossless methods must
reproduce) and records, per request and method, the tokens, target forwards, seconds and whether
the tokens equal the draft-free ones. It stays task-blind: prompts, stop strings and scoring come
from the task YAMLs. A lossy method (`methods=sets_max@8`: max-commit, opt-in) is the labelled
exception: its divergences are measured, not failures, and its own text is scored with the task's
filters and metrics beside the draft-free one (spot_eval.harness.rescore).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch
from lm_eval.api.model import LM
from tqdm import tqdm

from spot import DecodeConfig, Request, generate, generate_batch
from spot.drafters.base import DraftError
from spot_eval import registry
from spot_eval.checkpoints.target import load_target, read_target, resolve_checkpoint, target_id
from spot_eval.execution.sandbox import SandboxError, confinement
from spot_eval.harness import settings
from spot_eval.harness.interrupts import kept_interrupts
from spot_eval.harness.lossless import MethodRecord, diverge
from spot_eval.harness.methods import MethodSpec, build_drafter, drafter_file, parse_methods, split_list
from spot_eval.harness.model_args import SpotArgs
from spot_eval.harness.parallel import Ranks
from spot_eval.harness.placement import device_names, plan_placement, wanted
from spot_eval.harness.profile import Refitted, auto_sizing, drafter_seconds, verify_profile
from spot_eval.harness.session import MethodFailure, RequestRecord, Session
from spot_eval.method import PluginError
from spot_eval.tracking.store import check_uri
from spot_eval.tracking.writer import TrackingConfig, announce_unreachable, git_commit, open_tracker

WINDOW = 8  # requests per batch slot decoded before their records are kept (batch size > 1)


@dataclass(frozen=True)
class _Job:
    """One lm-eval request as decoded: its prompt, repeat, noise key and decoder settings."""

    req: object  # lm-eval's Instance
    doc_id: int | None  # the document's index in its split (SpotLM.document)
    context: str
    repeat: int
    number: int  # the noise key's request number (_request_id)
    config: DecodeConfig  # with the request's max_gen_toks and until
    ids: list[int]


@dataclass
class _Running:
    forwards: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)
    tokens: int = 0


class SpotLM(LM):
    def __init__(self, batch_size: int | str | None = 1, max_batch_size: int | None = None, **kwargs) -> None:
        super().__init__()
        self.args = args = SpotArgs.parse(kwargs)
        batching = settings.parse_batch_size("--batch_size", batch_size, max_batch_size)
        # Everything that can be checked is checked before the weights load and the MLflow run opens.
        device = settings.resolve_device("device", args.device)
        check_uri("mlflow_tracking_uri", args.mlflow_tracking_uri)
        self.ranks = Ranks.from_environment(device)  # under accelerate launch: this process's share of the requests
        self._rank, self._world_size = self.ranks.rank, self.ranks.world_size
        if device.startswith("cuda") and self.ranks.world_size > 1:
            device = f"cuda:{self.ranks.local_rank}"
        dtype = settings.resolve_dtype("dtype", args.dtype, device)
        path = resolve_checkpoint(args.pretrained, args.revision)
        checkpoint = read_target(path)  # the one parse of the checkpoint (load_target below takes it)
        block_length = checkpoint.info.block_size if args.block_length is None else args.block_length
        self.config = args.decode_config(block_length)
        if self.config.gen_length < block_length:
            raise ValueError(
                f"gen_length {self.config.gen_length} is below one block ({block_length}); "
                "raise gen_length or lower block_length"
            )
        if args.max_budget < 1:
            raise ValueError(f"max_budget={args.max_budget}: budget=auto's cap must be >= 1 (default {settings.MAX_BUDGET})")
        if args.draft_timeout <= 0:
            raise ValueError(f"draft_timeout={args.draft_timeout}: give the seconds one draft may take, > 0 (default "
                             f"{settings.DRAFT_TIMEOUT:g})")
        registry.load_plugins(split_list(args.plugins))  # on every rank: each builds its own drafters
        self.specs: list[MethodSpec] = parse_methods(args.methods, args.budgets, args.max_budget)  # less any that fails
        asked = tuple(self.specs)
        if self.specs and not args.reference:
            raise ValueError("reference=False leaves nothing to compare the methods with; drop methods or keep reference")
        for spec in self.specs:
            drafter_file(spec, block_length, self.config.policy)
            spec.config(self.config)  # a lossy method's acceptance rule is checked against the policy here
        settings.check_output_dir("output_dir", args.output_dir)
        settings.check_budgets({s.label: self.config.verify_pieces(s.budget) for s in self.specs if not s.auto},
                               block_length, checkpoint.info.vocab_size, dtype, device)
        if self.ranks.main:  # a tracking server that does not answer: said now, in one line, with the way back
            announce_unreachable(TrackingConfig(args.mlflow_tracking_uri, args.mlflow_experiment))
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"threads={args.threads}: use threads >= 1 (1 on a machine shared with other work)")
            torch.set_num_threads(args.threads)
        planned = plan_placement(args, device, checkpoint, dtype) if wanted(args) else None
        self.target = load_target(checkpoint, args.block_length, device, args.exact, dtype, args.cache,
                                  None if planned is None else planned.placement)
        self._device = self.target.device  # a spread target's: where its embedding runs
        self._drafters, failed = {}, []
        for spec in list(self.specs):
            try:
                if not spec.needs_reference:
                    self._drafters[spec.label] = build_drafter(spec, self.target, self.config.policy, threshold=self.config.threshold,
                                                               rule=self.config.rule, draft_timeout=args.draft_timeout)
            except PluginError as err:  # a plugin's method that cannot start: reported failed, the others run
                self.specs.remove(spec)
                failed.append(MethodFailure.of(spec.label, str(spec.origin), err))
        self._sizings, profile = self._auto_sizings(failed)
        pieces = self.config.verify_pieces(max([s.budget for s in self.specs], default=0))
        self.batch_size = settings.resolve_batch_size(batching, self.target, self.config.gen_length, pieces)
        self._target_id = target_id(args.pretrained, path)
        # One MLflow run for the whole evaluation: rank 0's; the other ranks hand their records to it.
        tracking = TrackingConfig(self.args.mlflow_tracking_uri, self.args.mlflow_experiment)
        tracker = open_tracker(tracking if self.ranks.main else None)
        lm_eval_version = _lm_eval_version()
        identity = identity_tags(self._target_id, args.revision, self.target, self._device, lm_eval_version) | {
            "spot_eval.batch_size": str(self.batch_size)}
        run = {"model_args": asdict(self.args), "decoder": _config_dict(self.config),
               "lm_eval_version": lm_eval_version, "target_id": self._target_id,
               "sandbox": _sandbox(), "world_size": self.ranks.world_size, "profile": profile, "batch_size": self.batch_size,
               # the devices this process's copy of the target runs on (each one's peak memory is recorded)
               "devices": device_names(self.target.model, self._device),
               "device_map": None if planned is None else {k: str(v) for k, v in planned.placement.device_map},
               "bytes_on_disk": 0 if planned is None else dict(planned.bytes_by_device).get("disk", 0),
               # each method's name, colour and origin: a report drawn where a plugin is not installed reads them here
               "methods": {name: registry.description(name) for name in dict.fromkeys(s.name for s in asked)},
               # what ran, for the reports' headers (the same as the MLflow tags, with the commit)
               "identity": {k.removeprefix("spot_eval."): v for k, v in identity.items()} | {"commit": git_commit()}}
        tracker.log_params({**_flatten({"model_args": run["model_args"], "decoder": run["decoder"],
                                        "sandbox": run["sandbox"], "profile": profile or {}}),
                            "lm_eval_version": run["lm_eval_version"], "world_size": self.ranks.world_size,
                            "batch_size": self.batch_size,
                            **_flatten(self._fingerprints())})
        tracker.set_tags(identity)
        self.session = Session(self.args, self._fingerprints(), tracker, self.args.output_dir, run, self.ranks)
        for failure in failed:
            self.session.fail(failure)
        self._repeat = Counter()
        self.samples: dict[str, list[int]] | None = None  # lm-eval's --samples, set before evaluate (registration)
        self._store = None  # lm-eval's --use_cache file, once set_cache_hook hands it over

    def _auto_sizings(self, failed: list[MethodFailure]) -> tuple[dict[str, Refitted], dict | None]:
        """budget=auto's inputs per auto method: this device's verify-cost profile (cached, or measured
        once), the drafter's seconds per tree (measured now), its mean reach, refitted to decoding's own
        timings after every request; and the profile for the record. A plugin's drafter that fails to be
        measured joins `failed`."""
        auto = [s for s in self.specs if s.auto]
        if not auto:
            return {}, None
        profile = verify_profile(self.target)
        sizings, record = {}, {**profile.to_dict(), "drafter_seconds": {}}
        for spec in auto:
            try:
                sizing = auto_sizing(self.target, self._drafters[spec.label], spec.config(self.config), profile)
            except Exception as err:
                if spec.origin == registry.BUILT_IN:
                    raise
                self.specs.remove(spec)
                failed.append(MethodFailure.of(spec.label, str(spec.origin), err, "measuring its drafter for budget=auto"))
                continue
            sizings[spec.label] = Refitted(sizing)
            record["drafter_seconds"][spec.label] = drafter_seconds(sizing)
        return sizings, record

    # -- lm-eval contract --------------------------------------------------------------------------

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> SpotLM:
        # lm-eval passes --device/--batch_size beside model_args; a model_args value wins (no clash).
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if "device" in extra and "device" not in arg_dict:
            extra["device"] = settings.fall_back_device(str(extra["device"]))
        return cls(**{**extra, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> SpotLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    def loglikelihood(self, requests):
        raise NotImplementedError("spot is a generate_until model: block-diffusion decoding has no loglikelihood API")

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError("spot is a generate_until model: block-diffusion decoding has no loglikelihood API")

    @property
    def tokenizer_name(self) -> str:
        return self.target.name.replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        tokenizer = self.target.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"--apply_chat_template needs a chat template and the tokenizer of {self.target.name} has none")
        return tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    def set_cache_hook(self, cache_hook) -> None:
        """lm-eval's `--use_cache` keys requests by (prompt, gen_kwargs) only, so one cache file must hold one
        configuration: the first run stamps it with every setting that changes a response or a record, and a
        run with another one is refused, naming the settings that differ. Beside each response the cache then
        holds the request's records (`_keep`), from which a rerun reports the requests it does not decode."""
        super().set_cache_hook(cache_hook)
        store = getattr(cache_hook, "dbdict", None)
        if store is None:
            return
        stamp = self._stamp()
        found = store.get(CACHE_STAMP)
        if found is None:
            store[CACHE_STAMP] = json.dumps(stamp, sort_keys=True)
        else:
            recorded = _stamp_fields(found)
            differ = sorted(k for k in recorded.keys() | stamp.keys() if recorded.get(k) != stamp.get(k))
            if differ:
                said = "; ".join(f"{k}: {json.dumps(recorded.get(k))} there, {json.dumps(stamp.get(k))} here" for k in differ)
                raise ValueError(f"the --use_cache file was written under other settings ({said}); use a separate "
                                 "--use_cache path per configuration")
        self._store = store

    def _stamp(self) -> dict:
        """The settings a cached response and its records depend on, flat."""
        config = _config_dict(self.config)
        config = {**{k: v for k, v in config.items() if not isinstance(v, dict)},
                  **{k: v for part in config.values() if isinstance(part, dict) for k, v in part.items()}}  # sampling's
        return {
            "target": self._target_id, "revision": self.args.revision, "dtype": str(self.target.model.dtype).removeprefix("torch."),
            "exact": self.args.exact, "cache": self.target.cache, "methods": [s.label for s in self.specs],
            "batch_size": self.batch_size,
            "drafters": self._fingerprints()["drafters"], **{k: config[k] for k in sorted(config)},
        }

    def finish(self, results: dict | None, tasks: dict | None = None, limit: float | None = None) -> None:
        """After lm-eval scored the outputs (registration wraps lm-eval's evaluate to call this, with its --limit):
        the records of the requests lm-eval answered from its cache join those decoded here, then the session
        writes the run."""
        self.session.records.extend(self._resumed(tasks))
        self.session.finish(results, tasks, limit)

    def _keep(self, req, record: RequestRecord) -> None:
        if self._store is not None:
            self._store[_record_key(req.args, record.repeat)] = record.to_json()

    def _resumed(self, tasks: dict | None) -> list[RequestRecord]:
        """The records of this rank's requests that an earlier process decoded (lm-eval answered them from its
        cache, so they never reached generate_until here). Raises where one is missing."""
        if self._store is None or tasks is None:
            return []
        decoded = {(r.task, r.doc_id, r.repeat) for r in self.session.records}
        records = []
        for inst in _instances(tasks):
            for repeat in range(inst.repeats):
                if (inst.task_name, self.document(inst), repeat) in decoded:
                    continue
                found = self._store.get(_record_key(inst.args, repeat))
                if found is None:
                    raise ValueError(
                        f"lm-eval answered {inst.task_name} doc {self.document(inst)} from its --use_cache file, which holds no "
                        "spot-eval record of it (the file predates record keeping); rerun with a fresh --use_cache path"
                    )
                records.append(RequestRecord.from_json(found))
        return records

    def get_model_info(self) -> dict:
        return {"spot": {"decoder": _config_dict(self.config), "methods": [s.label for s in self.specs], **self._fingerprints()}}

    @property
    def device(self) -> torch.device:
        return self._device  # lm-eval puts the per-rank request counts it all-gathers here

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.ranks.all_gather(tensor)

    def gather_object(self, obj: object, dst: int = 0) -> list | None:
        return self.ranks.gather_object(obj, dst)

    def barrier(self) -> None:
        self.ranks.barrier()

    def generate_until(self, requests) -> list[str]:
        with kept_interrupts() as check:
            out = self._generate(requests, check)
        self.session.flush()
        return out

    def _generate(self, requests, interrupted: Callable[[], None]) -> list[str]:
        out: list[str] = []
        running = _Running()
        seen: Counter = Counter()
        texts: dict[int, str] = {}
        bar = tqdm(total=len(requests), desc=f"spot rank {self.rank}" if self.world_size > 1 else "spot", unit="req",
                   dynamic_ncols=True)
        # At batch B > 1 a window of WINDOW * B requests decodes per method with continuous batching, so that a long
        # answer holds no slot idle for long; an interruption loses at most the window in flight (one request at B = 1).
        window = self.batch_size * (WINDOW if self.batch_size > 1 else 1)
        for first in range(0, len(requests), window):
            interrupted()
            chunk = requests[first : first + window]
            fresh = []  # lm-eval repeats an Instance `repeats` times in the list: each occurrence is decoded
            for req in chunk:
                seen[id(req)] += 1
                # lm-eval pads a shorter rank with copies of its last request beyond that request's repeats:
                # answered, never decoded or counted.
                fresh.append(seen[id(req)] <= req.repeats)
            decoded = iter(self._decode([req for req, new in zip(chunk, fresh, strict=True) if new]))
            for req, new in zip(chunk, fresh, strict=True):
                if not new:  # a padding copy: its request's text (the copies come after every repeat of it)
                    out.append(texts[id(req)])
                    continue
                record = next(decoded)
                texts[id(req)] = record.text
                out.append(record.text)
                self._keep(req, record)  # before the response: a cached response always has its record
                self.cache_hook.add_partial("generate_until", req.args, record.text)
                running.tokens += len(record.methods[0].token_ids)
                for m in record.methods:
                    running.forwards[m.label] += m.forwards
                    running.seconds[m.label] += m.seconds
            bar.update(len(chunk))
            ref_s = running.seconds["draft_free"] or 1e-9
            postfix = {"tok/s": f"{running.tokens / ref_s:.1f}"}
            for s in self.specs[:2]:
                if running.forwards[s.label]:
                    postfix[f"{s.label} fwd×"] = f"{running.forwards['draft_free'] / running.forwards[s.label]:.2f}"
            bar.set_postfix(postfix)
        bar.close()
        interrupted()
        return out

    # -- a batch of requests -------------------------------------------------------------------------

    def document(self, inst) -> int | None:
        """An Instance's document index in its split. Under --samples lm-eval numbers the chosen documents 0, 1, ...
        (and maps them back only in its own samples files): the records, the resume and the noise key take the
        split's index, so a document decodes the same whichever selection it is in."""
        chosen = (self.samples or {}).get(inst.task_name)
        return chosen[inst.doc_id] if chosen is not None and inst.doc_id is not None else inst.doc_id

    def _decode(self, reqs: list) -> list[RequestRecord]:
        """Decode draft-free and by each method, `reqs` batch_size at a time (continuous batching), method after method.
        At batch B > 1 draft-free decoding also runs at batch 1: a request whose batch-B tokens differ from its
        batch-1 ones is a divergence like a method's (`RequestRecord.batch_divergence`)."""
        tokenizer, decode, mask_id, b = self.target.tokenizer, self.target.tokenizer.decode, self.target.mask_id, self.batch_size
        jobs = []
        for req in reqs:
            context, gen_kwargs = req.args
            doc_id = self.document(req)
            key = (req.task_name, doc_id)
            repeat = self._repeat[key]
            self._repeat[key] += 1
            until = tuple(s for s in gen_kwargs.get("until") or () if s)
            max_new = int(gen_kwargs.get("max_gen_toks") or self.config.gen_length)
            jobs.append(_Job(req, doc_id, context, repeat, _request_id(req.task_name, doc_id, repeat),
                             replace(self.config, gen_length=max_new, stop_strings=until),
                             tokenizer(context, add_special_tokens=False)["input_ids"]))
        references = generate_batch(self.target, [Request(j.ids, j.config, number=j.number) for j in jobs], b, decode=decode,
                                    record=True, record_margins=True)
        eos = self.target.eos_ids
        methods = [[MethodRecord.of("draft_free", 0, ref, ref, j.config, mask_id, eos_ids=eos)]
                   for ref, j in zip(references, jobs, strict=True)]
        for spec in list(self.specs):
            auto = self._sizings.get(spec.label)
            try:
                requests = [Request(j.ids, spec.config(j.config), self._drafters.get(spec.label)
                                    or build_drafter(spec, self.target, j.config.policy, ref, j.config.threshold,
                                                     draft_timeout=self.args.draft_timeout), j.number, auto and auto.sizing)
                            for ref, j in zip(references, jobs, strict=True)]
                decoded = generate_batch(self.target, requests, b, decode=decode, record=True)
            except (DraftError, PluginError) as err:  # the method stops, named with its origin; the others go on
                self.specs.remove(spec)
                where = f"decoding {jobs[0].req.task_name} doc {jobs[0].doc_id}" + (f" and {len(jobs) - 1} more in its batch" if len(jobs) > 1 else "")
                self.session.fail(MethodFailure.of(spec.label, str(spec.origin), err, where))
                continue
            for got, ref, j, mine in zip(decoded, references, jobs, methods, strict=True):
                if auto:
                    auto.observe(got.stats)
                mine.append(MethodRecord.of(spec.name, spec.budget, got, ref, j.config, mask_id, auto=spec.auto, lossy=spec.lossy,
                                            eos_ids=eos))
        records = []
        for ref, j, mine in zip(references, jobs, methods, strict=True):
            alone = None if b == 1 else diverge(ref, generate(self.target, j.ids, j.config, request=j.number, decode=decode,
                                                              record=True, record_margins=True), j.config, mask_id)
            records.append(RequestRecord(
                task=j.req.task_name, doc_id=j.doc_id, repeat=j.repeat, request=j.number,
                prompt_sha256=hashlib.sha256(j.context.encode()).hexdigest()[:16], text=ref.text, methods=mine,
                batch_size=b, batch_divergence=alone,
            ))
            self.session.add(records[-1])
        return records

    def _fingerprints(self) -> dict:
        return {"target": self.target.name, "drafters": {s.label: s.path or "shipped" for s in self.specs}}


CACHE_STAMP = "spot-eval/decoder-config"


def _record_key(args: tuple, repeat: int) -> str:
    """Where a request's record sits in lm-eval's cache: beside its response, keyed the way lm-eval keys it."""
    from lm_eval.api.model import hash_args

    return f"spot-eval/record/{hash_args('generate_until', args)}/{repeat}"


def _stamp_fields(found: str) -> dict:
    """A cache file's stamp as flat settings (files stamped before the flat form: target, decoder, exact)."""
    raw = json.loads(found)
    if "decoder" in raw and isinstance(raw["decoder"], dict):
        raw = {**{k: v for k, v in raw.items() if k != "decoder"}, **raw["decoder"]}
    return raw


def _instances(tasks: dict):
    """Every generate_until instance of lm-eval's task dict (groups nest their tasks as dicts)."""
    for value in tasks.values():
        if isinstance(value, dict):
            yield from _instances(value)
        else:
            yield from (i for i in getattr(value, "instances", ()) if i.request_type == "generate_until")


def _request_id(task: str | None, doc_id: int | None, repeat: int) -> int:
    """Per-request noise key: reproducible from (task, doc, repeat), different across repeats."""
    digest = hashlib.sha256(json.dumps([task, doc_id, repeat]).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _config_dict(config: DecodeConfig) -> dict:
    d = asdict(config)
    d.pop("stop_strings")
    d.pop("acceptance")  # the draft-free decoder's is always exact; a lossy method's goes with its label
    return d


def _sandbox() -> dict:
    """What confines the code tasks' programs on this machine (spot_eval.execution.sandbox)."""
    try:
        granted = confinement()
        return {**asdict(granted), "gaps": granted.gaps()}
    except SandboxError as err:
        return {"unavailable": str(err)}


def identity_tags(target: str, revision: str | None, model, device: torch.device, lm_eval_version: str) -> dict[str, str]:
    """What ran, as MLflow tags on the evaluation's run: target and revision, dtype, device (and GPU model) and
    the versions that decide the numbers (open_tracker tags the commit of spot-eval)."""
    from importlib.metadata import version

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return {"spot_eval.target": target, "spot_eval.revision": revision or "", "spot_eval.dtype": str(model.model.dtype).removeprefix("torch."),
            "spot_eval.device": str(device), "spot_eval.gpu": gpu, "spot_eval.torch": torch.__version__,
            "spot_eval.transformers": version("transformers"), "spot_eval.lm_eval": lm_eval_version}


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out
