"""Prompt data: files -> validated records -> groups of Samples, with an exactly resumable state.

Files: JSONL (one JSON object a line) or Parquet (when pyarrow is importable). Per record:
``--input-key`` (the prompt: text, or an OpenAI message list with ``--apply-chat-template``),
``--label-key`` (optional ground truth), ``--metadata-key`` (optional dict).

Order: the file order, or with ``--rollout-shuffle`` a permutation per epoch drawn from
``random.Random(rollout_seed + epoch)``, so it can be recomputed on resume instead of saved.
State = (epoch, offset into that epoch's order, next group id, buffer of partial groups);
``load_state_dict(state_dict())`` continues with exactly the prompt that would have come next.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import random

from slime_like.config.data_rows import MAX_ROW_DEPTH, bounded_lines, nesting_depth, not_a_data_file, parse_row

from ..sample import Sample, Status
from .hooks import load_hook
from .serialize import sample_from_dict, sample_to_dict

logger = logging.getLogger(__name__)


class PromptDataError(ValueError):
    pass


def _read_rows(path: str, flag: str):
    """Yield (row number, dict). JSONL rows are 1-based line numbers."""
    why = not_a_data_file(path)
    if why:
        raise PromptDataError(f"{flag} {path}: {why}")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise PromptDataError(f"{flag} {path!r}: reading Parquet needs pyarrow (pip install pyarrow), "
                                  f"or convert the file to JSONL") from exc
        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, row
        return
    if path.endswith(".json"):  # ROLL's data files: one JSON array of records (JSONL in a .json file also works)
        with open(path, encoding="utf-8") as f:
            head = f.read(4096).lstrip()[:1]
        if head == "[":
            yield from _json_array_rows(path, flag)
            return
    with open(path, "rb") as f:
        for line_no, raw in bounded_lines(f):  # a BOM on the first line is accepted; a bad line is named
            row, problem = parse_row(raw, first_line=line_no == 1)
            if problem:
                raise PromptDataError(f"{flag}: {path}:{line_no}: {problem}")
            if row is None:
                continue
            if not isinstance(row, dict):
                raise PromptDataError(f"{flag}: {path}:{line_no}: expected a JSON object, got "
                                      f"{type(row).__name__}")
            yield line_no, row


def _json_array_rows(path: str, flag: str):
    """Rows of a JSON-array file, numbered from 1 by their position in the array."""
    with open(path, encoding="utf-8-sig") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise PromptDataError(f"{flag}: {path}:{exc.lineno}: malformed JSON ({exc.msg} at column "
                                  f"{exc.colno})") from exc
        except RecursionError:
            raise PromptDataError(f"{flag}: {path}: JSON nested deeper than Python can read "
                                  f"(at most {MAX_ROW_DEPTH} levels)") from None
    for i, row in enumerate(data, start=1):
        if nesting_depth(row) > MAX_ROW_DEPTH:
            raise PromptDataError(f"{flag}: {path}: array entry {i}: JSON nested more than {MAX_ROW_DEPTH} levels")
        if not isinstance(row, dict):
            raise PromptDataError(f"{flag}: {path}: array entry {i}: expected a JSON object, got {type(row).__name__}")
        yield i, row


def _missing_key(path, line_no, key, flag, row) -> PromptDataError:
    import difflib

    close = difflib.get_close_matches(key, list(row), n=1)
    hint = f"; did you mean {flag} {close[0]}?" if close else ""
    return PromptDataError(f"{path}:{line_no}: {flag} {key!r} is not in the record (keys present: "
                           f"{sorted(row)}){hint}")


def tokenize_prompt(tokenizer, prompt, apply_chat_template: bool, where: str = "", tools=None,
                    template_kwargs: dict | None = None) -> list[int]:
    if apply_chat_template:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not (isinstance(messages, list) and all(isinstance(m, dict) and "role" in m and "content" in m
                                                   for m in messages)):
            raise PromptDataError(f"{where}: --apply-chat-template needs a message list "
                                  f"[{{'role': ..., 'content': ...}}, ...] or a string, got {prompt!r:.80}")
        kwargs = dict(template_kwargs or {})
        if tools is not None:
            kwargs["tools"] = tools
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    else:
        if not isinstance(prompt, str):
            raise PromptDataError(f"{where}: the prompt is a {type(prompt).__name__}, not text; pass "
                                  f"--apply-chat-template for message lists")
        text = prompt
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def load_prompts(path: str, tokenizer, input_key: str = "input", label_key: str | None = None,
                 metadata_key: str | None = "metadata", apply_chat_template: bool = False,
                 max_prompt_len: int | None = None, flag: str = "--prompt-data", tool_key: str | None = None,
                 template_kwargs: dict | None = None, context_length: int | None = None,
                 skip_bad: bool = False, tokenize: bool = True, multimodal_keys: dict | None = None,
                 processor=None) -> list[dict]:
    """Records ``{"prompt", "label", "metadata", "prompt_ids", "row"}``; long prompts dropped (logged).
    With ``multimodal_keys`` (--multimodal-keys) and the model's VisionProcessor, also ``multimodal_inputs``
    ({"image": [PNG data URL, ...]}, see _multimodal_prompt) and prompt_ids with the image tokens expanded.
    ``tokenize=False`` (the SFT rollout, which tokenizes whole conversations itself): prompt_ids stay empty.

    Every prompt is tokenized here, before any rollout. ``max_prompt_len`` (--rollout-max-prompt-len) drops
    longer prompts, as slime does. A prompt of no tokens, or one the engine cannot serve (``context_length``
    tokens or more: no room for one response token) is refused with the counts and first rows, unless
    ``skip_bad`` (--skip-over-long-prompts) drops them with a count.

    With a chat template, ``row[tool_key]`` (when present) is passed as ``tools=`` and
    ``template_kwargs`` (``--apply-chat-template-kwargs``) as extra keyword arguments.
    """
    records, too_long = [], 0
    unusable = {"empty": [], "over-long": []}
    for line_no, row in _read_rows(path, flag):
        if input_key not in row:
            raise _missing_key(path, line_no, input_key, "--input-key", row)
        if label_key is not None and label_key not in row:
            raise _missing_key(path, line_no, label_key, "--label-key", row)
        metadata = row.get(metadata_key) if metadata_key else None
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise PromptDataError(f"{path}:{line_no}: --metadata-key {metadata_key!r} holds a "
                                  f"{type(metadata).__name__}, expected an object")
        media = None
        if multimodal_keys:
            ids, media = _multimodal_prompt(processor, row, multimodal_keys, input_key, f"{flag} {path}:{line_no}",
                                            path, tools=row.get(tool_key) if tool_key else None,
                                            template_kwargs=template_kwargs)
        else:
            ids = tokenize_prompt(tokenizer, row[input_key], apply_chat_template, f"{path}:{line_no}",
                                  tools=row.get(tool_key) if tool_key else None,
                                  template_kwargs=template_kwargs) if tokenize else []
        if max_prompt_len is not None and len(ids) > max_prompt_len:
            too_long += 1
            continue
        if tokenize and (not ids or (context_length is not None and len(ids) >= context_length)):
            (unusable["over-long"] if ids else unusable["empty"]).append(line_no)
            continue
        records.append({"prompt": row[input_key], "label": row.get(label_key) if label_key else None,
                        "metadata": metadata, "prompt_ids": ids, "row": line_no, "multimodal_inputs": media})
    if max_prompt_len is not None:
        logger.info("%s %s: dropped %d of %d prompts longer than --rollout-max-prompt-len %d tokens",
                    flag, path, too_long, too_long + len(records), max_prompt_len)
    _refuse_or_drop(unusable, path, flag, context_length, skip_bad)
    if not records:
        raise PromptDataError(f"{flag} {path!r}: no usable prompts ({too_long} longer than "
                              f"--rollout-max-prompt-len {max_prompt_len})")
    return records


def _multimodal_prompt(processor, row: dict, multimodal_keys: dict, input_key: str, where: str, path: str,
                       tools=None, template_kwargs: dict | None = None):
    """(prompt ids with the image tokens expanded, {"image": [data URL, ...]} or None) of one multimodal record.

    The prompt always goes through the processor's chat template (only the template writes the vision
    placeholders, as slime applies it whenever --multimodal-keys is set); images load relative to the data file."""
    from slime_like.multimodal.processor import prompt_token_ids
    from slime_like.multimodal.records import data_dir, data_urls, record_images

    try:
        messages, images = record_images(row, multimodal_keys, input_key, where, data_dir(path))
    except ValueError as exc:   # ImageLoadError / PromptImagesError: already name the row
        raise PromptDataError(str(exc)) from None
    kwargs = dict(template_kwargs or {})
    if tools is not None:
        kwargs["tools"] = tools
    text = processor.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    ids = prompt_token_ids(processor, text, images)
    return ids, ({"image": data_urls(images)} if images else None)


def _refuse_or_drop(unusable: dict, path: str, flag: str, context_length, skip_bad: bool) -> None:
    bad = {k: v for k, v in unusable.items() if v}
    if not bad:
        return
    what = "; ".join(f"{len(v)} {k} (rows {', '.join(map(str, v[:5]))}{', ...' if len(v) > 5 else ''})"
                     for k, v in bad.items())
    why = (f"empty: no tokens to generate from; over-long: {context_length} tokens or more, the engine's context "
           f"length, leaves no room for a response")
    if not skip_bad:
        raise PromptDataError(f"{flag} {path}: {what} prompts ({why}). Fix the data, or pass "
                              f"--skip-over-long-prompts to drop them")
    logger.warning("%s %s: --skip-over-long-prompts dropped %s prompts (%s)", flag, path, what, why)


def prompt_context_length(args) -> int | None:
    """The engines' context length: --sglang-context-length, else the HF config's max_position_embeddings."""
    value = args.sglang_server_args.get("context_length")  # what the user set, from either passthrough mode
    if value:
        return int(value)
    path = os.path.join(args.hf_checkpoint or "", "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    n = cfg.get("max_position_embeddings")
    return int(n) if isinstance(n, int) else None


def multimodal_processor(args):
    """The checkpoint's VisionProcessor when the run reads images (--multimodal-keys), else None."""
    if not args.multimodal_keys:
        return None
    from slime_like.multimodal.processor import cached_processor

    return cached_processor(args.hf_checkpoint, bool(args.trust_remote_code))


def is_sft_rollout(args) -> bool:
    from slime_like.config.slime_paths import resolve

    return resolve(args.rollout_function_path) == "slime_like.rollout.sft_rollout.generate_rollout"


def make_group(record: dict, group_index: int, n_samples: int, processor=None) -> list[Sample]:
    """The n samples of one prompt. A multimodal record's images are processed once here, for the group: its
    samples share one multimodal_train_inputs (never modified in place)."""
    media = record.get("multimodal_inputs")
    train_inputs = None
    if media:
        from slime_like.multimodal.processor import train_inputs_of

        train_inputs = train_inputs_of(processor, media)
    return [Sample(index=group_index * n_samples + j, group_index=group_index, prompt=record["prompt"],
                   label=record["label"], metadata=copy.deepcopy(record["metadata"]),
                   tokens=list(record["prompt_ids"]), status=Status.PENDING,
                   multimodal_inputs=copy.deepcopy(media), multimodal_train_inputs=train_inputs)
            for j in range(n_samples)]


class RolloutDataSource:
    """Hands out prompt groups (``get_samples``) and takes back unfinished ones (``add_samples``)."""

    def __init__(self, args, tokenizer, path: str | None = None):
        self.args = args
        path = path or args.prompt_data
        if not path:
            raise PromptDataError("--prompt-data PATH is required (a JSONL or Parquet file of prompts)")
        # --prompt-data-extra: more files after the first, one dataset (only for the run's own --prompt-data)
        extra = list(args.prompt_data_extra or []) if path == args.prompt_data else []
        self.records = []
        # which files, by name and size: a resume may change the filters, not the data
        self.multimodal_keys = args.multimodal_keys or None
        self.processor = multimodal_processor(args)
        self.files = [{"name": os.path.basename(f), "bytes": os.path.getsize(f) if os.path.exists(f) else None}
                      for f in (path, *extra)]
        for i, one in enumerate([path, *extra]):
            self.records += load_prompts(one, tokenizer, args.input_key, args.label_key,
                                         args.metadata_key,
                                         bool(args.apply_chat_template),
                                         args.rollout_max_prompt_len,
                                         flag="--prompt-data-extra" if i else "--prompt-data",
                                         tool_key=args.tool_key,
                                         template_kwargs=args.apply_chat_template_kwargs,
                                         context_length=prompt_context_length(args),
                                         skip_bad=bool(args.skip_over_long_prompts),
                                         tokenize=not is_sft_rollout(args),
                                         multimodal_keys=self.multimodal_keys, processor=self.processor)
            for rec in self.records:
                rec.setdefault("key", f"{i}:{rec['row']}")  # identity across filter changes: file and row
        self.n_samples = int(args.n_samples_per_prompt)
        self.shuffle = bool(args.rollout_shuffle)
        self.seed = int(args.rollout_seed)
        self.epoch, self.offset, self.next_group_index = 0, 0, 0
        self.buffer: list[list[Sample]] = []
        self._order = self._epoch_order(0)
        self._consumed_before: list[str] = []   # keys taken this epoch before a resume with other records

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def _next_record(self) -> dict:
        if self.offset >= len(self._order):
            self.epoch += 1
            self.offset = 0
            self._order = self._epoch_order(self.epoch)
            self._consumed_before = []
        rec = self.records[self._order[self.offset]]
        self.offset += 1
        return rec

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """``num_groups`` groups: buffered (partial) ones first, then fresh prompts."""
        taken = self._from_buffer(num_groups)
        while len(taken) < num_groups:
            taken.append(make_group(self._next_record(), self.next_group_index, self.n_samples, self.processor))
            self.next_group_index += 1
        return taken

    def _from_buffer(self, num_groups: int) -> list[list[Sample]]:
        """FIFO, or slime's ``--buffer-filter-path``: ``filter(args, rollout_id, buffer, num_samples)`` returns
        at most ``num_samples`` groups of the buffer (rollout_id is None, as in slime). The groups it returns
        leave the buffer here, whether or not the filter removed them itself (slime's pop_first does)."""
        path = self.args.buffer_filter_path
        if not path or not self.buffer or not num_groups:
            taken, self.buffer = self.buffer[:num_groups], self.buffer[num_groups:]
            return taken
        fn = load_hook(path, "--buffer-filter-path", "filter(args, rollout_id, buffer, num_samples)",
                       "args", "rollout_id", "buffer", "num_samples")
        buffered = list(self.buffer)
        taken = list(fn(self.args, None, self.buffer, num_groups) or [])
        known = {id(g) for g in buffered}
        if len(taken) > num_groups or any(id(g) not in known for g in taken):
            raise ValueError(f"--buffer-filter-path {path}: must return at most {num_groups} groups taken from the "
                             f"buffer, got {len(taken)} (some not from the buffer)")
        chosen = {id(g) for g in taken}
        self.buffer = [g for g in buffered if id(g) not in chosen]
        return taken

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Return unfinished groups (aborted by over-sampling / partial rollout); they come out first next."""
        for g in groups:
            if len({s.group_index for s in g}) != 1:
                raise ValueError("add_samples takes whole groups (all samples of one prompt)")
        self.buffer.extend(groups)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "next_group_index": self.next_group_index,
                "num_records": len(self.records), "shuffle": self.shuffle, "seed": self.seed,
                "files": self.files,
                "consumed_keys": self._consumed_before + [self.records[i]["key"] for i in self._order[:self.offset]],
                "buffer": [[sample_to_dict(s) for s in g] for g in self.buffer]}

    def load_state_dict(self, state: dict) -> None:
        """Continue where the state left off. The position is kept by prompt identity (file, row): this epoch's
        order minus the prompts already taken, so a resume with a changed filter (--rollout-max-prompt-len,
        --skip-over-long-prompts) goes on with the prompts not used yet instead of failing or repeating."""
        if (state["shuffle"], state["seed"]) != (self.shuffle, self.seed):
            logger.warning("resuming with different --rollout-shuffle/--rollout-seed than saved (%s, %s)",
                           state["shuffle"], state["seed"])
        self.epoch, self.next_group_index = state["epoch"], state["next_group_index"]
        self.buffer = [[sample_from_dict(d) for d in g] for g in state["buffer"]]
        self._order = self._epoch_order(self.epoch)
        if "consumed_keys" not in state:   # a state from before identities were saved
            if state["num_records"] != len(self.records):
                raise ValueError(f"data source state was saved with {state['num_records']} prompts but "
                                 f"--prompt-data now has {len(self.records)}; resume with the same file")
            self.offset, self._consumed_before = state["offset"], []
            return
        if state.get("files", self.files) != self.files:
            raise ValueError(f"data source state was saved for --prompt-data {state['files']} ({state['num_records']} "
                             f"prompts) but it is now {self.files}; resume with the same file")
        consumed = set(state["consumed_keys"])
        self._order = [i for i in self._order if self.records[i]["key"] not in consumed]
        self._consumed_before, self.offset = list(state["consumed_keys"]), 0
        if state["num_records"] != len(self.records):
            logger.warning("--prompt-data now yields %d prompts (saved with %d: a filter changed); epoch %d "
                           "continues with the %d not used yet", len(self.records), state["num_records"], self.epoch,
                           len(self._order))


DataSource = RolloutDataSource   # short name used by the loop and its tests
