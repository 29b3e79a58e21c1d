"""`suffixspec merge INDEX... -o OUT`: compact indexes (and their shards) into one."""

from __future__ import annotations

import time


def add_parser(subparsers):
    p = subparsers.add_parser("merge", help="compact indexes built with one tokenizer into one index (deleted documents dropped)")
    p.add_argument("indexes", nargs="+", metavar="INDEX", help="the indexes to merge (one tokenizer)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="path of the merged index, written exactly")
    p.add_argument("--shard-tokens", type=int, default=None, metavar="N", help="split the result in shards of N tokens (default: one shard)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="shards built in parallel worker processes (default 1)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="when OUT is one of the inputs, wait up to SECONDS for its other writers (default 0: fail at once)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..corpus import merge_indexes
    from .args import check_writer_args, load_writer_modules

    check_writer_args(args)
    load_writer_modules()
    t0 = time.perf_counter()
    r = merge_indexes(args.indexes, args.output, shard_tokens=args.shard_tokens, jobs=args.jobs, wait=args.wait)
    print(f"merged {len(args.indexes)} index(es): {r.n_documents} documents, {r.n_tokens} tokens in {r.n_shards} shard(s) "
          f"-> {args.output}: {r.bytes_on_disk} bytes ({r.bytes_per_token:.1f} B/token), {time.perf_counter() - t0:.2f} s")
    return 0
