"""`suffixspec index INPUT... -o INDEX`: build a corpus index from text and JSONL files."""

from __future__ import annotations

import sys
import time

import numpy as np

BATCH_DOCS = 256
BATCH_BYTES = 4 << 20


def add_parser(subparsers):
    p = subparsers.add_parser("index", help="build a corpus index from text files, JSONL files and directories",
                              description="Build a corpus index. Text files are one document each; each line of a "
                                          ".jsonl file is one document; directories are walked recursively "
                                          "(.git, __pycache__, node_modules, hidden directories and binary files skipped).")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text file, .jsonl file or directory")
    p.add_argument("-o", "--output", required=True, metavar="INDEX", help="index path, written exactly (no extension added)")
    p.add_argument("--tokenizer", default=None, metavar="TOK",
                   help="HF tokenizer directory, tokenizer.json, GGUF file, or 'default' (the embedded SmolLM2)")
    p.add_argument("--glob", default=None, metavar="PATTERN", help="only files whose name matches, at any depth (e.g. '*.py'; default: every file)")
    p.add_argument("--field", default="text", help="JSONL field holding the text (default: text)")
    p.add_argument("--id-field", default=None, metavar="ID", help="JSONL field holding the document id (default: none; documents are numbered)")
    p.add_argument("--tag-field", default=None, metavar="TAGS", help="JSONL field holding tags: an object or a list of 'key=value' (default: none)")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="tag every document of this build (repeatable; default: no tag)")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed lines and unreadable files, counting them")
    p.add_argument("--shard-tokens", type=int, default=None, metavar="N", help="tokens per shard (default 16M)")
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="shards built in parallel worker processes (default: the CPU count, at most 4)")
    p.add_argument("--append", action="store_true", help="add the documents to the existing index INDEX as new shards")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS for another writer of INDEX to finish (default 0: fail at once)")
    p.set_defaults(func=run)
    return p


def parse_tags(items, what="--tag") -> dict:
    from ..errors import BadInputError

    out = {}
    for item in items:
        if "=" not in item or not item.split("=", 1)[0]:
            raise BadInputError(f"{what}: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def batch_encoder(tok):
    """texts -> token id arrays, as `tok.encode_batch` gives them: through `bytebpe.ByteLevelEncoder`
    for the byte-level BPE tokenizers it implements (the same ids), else the HF backend's
    `encode_batch_fast` when it has one (the same ids without the character offsets, which an index
    never reads), else `encode_batch`."""
    from ..tokenizer.bytebpe import ByteLevelEncoder

    own = ByteLevelEncoder.of(tok)
    if own is not None:
        return own.encode_batch
    fast = getattr(getattr(tok, "backend", None), "encode_batch_fast", None)
    if fast is None:
        return tok.encode_batch
    return lambda texts: [e.ids for e in fast(texts, add_special_tokens=False)]


def run(args) -> int:
    import os

    from tqdm import tqdm

    from ..corpus import (
        DEFAULT_SHARD_TOKENS,
        Document,
        ReadStats,
        append_documents,
        build_index,
        list_input_files,
        read_documents,
    )
    from ..errors import BadInputError
    from ..tokenizer import load_tokenizer
    from .args import check_writer_args, load_writer_modules

    t0 = time.perf_counter()
    check_writer_args(args)
    load_writer_modules()
    tags = parse_tags(args.tag)
    tok = load_tokenizer(args.tokenizer)
    files = list_input_files(args.inputs, args.glob)
    if not files:
        raise BadInputError(f"empty corpus: no input files found in {' '.join(args.inputs)}"
                            + (f" matching {args.glob!r}" if args.glob else ""))
    total_bytes = 0
    for f, _ in files:
        try:
            total_bytes += f.stat().st_size
        except OSError:
            pass
    stats = ReadStats()
    jobs = args.jobs if args.jobs is not None else max(1, min(os.cpu_count() or 1, 4))
    shard_tokens = DEFAULT_SHARD_TOKENS if args.shard_tokens is None else args.shard_tokens
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="indexing", file=sys.stderr, disable=None, leave=False)
    n_tokens = [0]

    def documents():
        batch, size, done = [], 0, 0
        texts = read_documents(args.inputs, field_name=args.field, id_field=args.id_field, tag_field=args.tag_field,
                               tags=tags, skip_bad=args.skip_bad, stats=stats, files=files)
        for text, doc_id, doc_tags in texts:
            batch.append((text, doc_id, doc_tags))
            size += len(text)
            if len(batch) >= BATCH_DOCS or size >= BATCH_BYTES:
                yield from encode(batch)
                bar.update(stats.bytes - done)
                done = stats.bytes
                batch, size = [], 0
        yield from encode(batch)
        bar.update(stats.bytes - done)

    encode_texts = batch_encoder(tok)

    def encode(batch):
        if not batch:
            return
        for (text, doc_id, doc_tags), ids in zip(batch, encode_texts([b[0] for b in batch])):
            n_tokens[0] += len(ids)
            yield Document(np.asarray(ids, np.int32), doc_id, doc_tags)

    try:
        if args.append:
            result = append_documents(args.output, documents(), tokenizer=tok, shard_tokens=shard_tokens, jobs=jobs,
                                      wait=args.wait)
        else:
            result = build_index(documents(), args.output, tokenizer=tok, shard_tokens=shard_tokens, jobs=jobs, wait=args.wait)
    except BadInputError as exc:
        if "empty corpus" in str(exc):
            raise BadInputError(f"empty corpus: no text in {stats.files} file(s) of {' '.join(args.inputs)}") from None
        raise
    finally:
        bar.close()
    dt = time.perf_counter() - t0
    skipped = []
    if stats.skipped_lines:
        skipped.append(f"{stats.skipped_lines} bad line(s)")
    if stats.skipped_files:
        skipped.append(f"{stats.skipped_files} unreadable or binary file(s)")
    verb = "appended" if args.append else "indexed"
    print(f"{verb} {result.n_documents} documents, {result.n_tokens} tokens from {stats.files} files "
          f"in {result.n_shards} shard(s) -> {args.output}: {result.bytes_on_disk} bytes "
          f"({result.bytes_on_disk / max(result.n_tokens, 1):.1f} B/token), {dt:.2f} s "
          f"({result.n_tokens / max(dt, 1e-9) / 1e6:.2f}M tokens/s)"
          + (f"; skipped {', '.join(skipped)}" if skipped else ""))
    return 0
