"""`suffixspec info INDEX [--json] [--query TEXT --filter K=V ...]`: validate, describe, query."""

from __future__ import annotations

import argparse
import json
import time


def add_parser(subparsers):
    p = subparsers.add_parser("info", help="validate an index fully (checksums included), describe it, optionally query it",
                              description="Validate an index (exit status 2 on any damage) and describe it. With "
                                          "--query, also print the longest match of TEXT's tokens, its count and top continuations.")
    p.add_argument("index", metavar="INDEX", help="the corpus index to describe")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--query", default=None, metavar="TEXT", help="text whose longest suffix is looked up (default: none)")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                   help="restrict the query to documents tagged KEY=VALUE (repeatable: all must hold); id=NAME selects by document id "
                        "(default: every document)")
    p.add_argument("--top", type=int, default=5, metavar="N", help="continuations shown (default 5)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="check every checksum (default); --no-verify: only the cheap checks every open makes")
    p.add_argument("--tokenizer", default=None, metavar="TOK", help="tokenizer for --query (default: the embedded one); must be the index's")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..corpus import CorpusIndex
    from ..errors import BadInputError
    from .index import parse_tags

    if args.filter and args.query is None:
        raise BadInputError("--filter restricts a query: give --query TEXT too")
    t0 = time.perf_counter()
    ix = CorpusIndex.open(args.index)
    open_ms = (time.perf_counter() - t0) * 1e3
    t1 = time.perf_counter()
    if args.verify:
        ix.verify()
    verify_ms = (time.perf_counter() - t1) * 1e3
    info = ix.info()
    info.update(open_ms=round(open_ms, 2), verify_ms=round(verify_ms, 1) if args.verify else None, valid=True,
                verified=args.verify)
    if args.query is not None:
        from ..tokenizer import load_tokenizer

        tok = load_tokenizer(args.tokenizer)
        ix.check_tokenizer(tok)
        filters = parse_tags(args.filter, "--filter")
        ids = [filters.pop("id")] if "id" in filters else None
        subset = ix.subset(tags=filters, ids=ids) if (filters or ids) else None
        context = tok.encode(args.query)
        t2 = time.perf_counter()
        m = ix.query(context, subset)
        q_us = (time.perf_counter() - t2) * 1e6
        top = [{"token": t, "text": tok.decode([t]), "count": c, "last_end": e,
                "document": ix.document_ids[ix.document_of(e)]} for t, c, e in m.top(args.top)]
        info["query"] = {"text": args.query, "n_context_tokens": len(context), "filter": args.filter,
                         "n_documents_selected": len(subset) if subset is not None else ix.n_documents - len(ix.deleted),
                         "match_length": m.length, "matched_text": tok.decode(context[len(context) - m.length:]) if m.length else "",
                         "count": m.count, "estimated": m.estimated, "continuations": top, "query_us": round(q_us, 1)}
    if not args.json:
        t = info["tokenizer"]
        print(f"{info['path']}: {'valid' if args.verify else 'openable (checksums not verified)'} suffixspec corpus index, "
              f"format version {info['format_version']}")
        print(f"  tokenizer   {t['name']} (vocab {t['vocab_size']}, fingerprint {t['fingerprint'][:16]})")
        print(f"  documents   {info['n_documents']} ({info['n_deleted']} deleted) in {info['n_shards']} shard(s)")
        print(f"  tokens      {info['n_tokens']}  states {info['n_states']}  edges {info['n_edges']}")
        print(f"  on disk     {info['bytes_on_disk']} bytes ({info['bytes_per_token']} B/token)")
        print(f"  open        {open_ms:.2f} ms, " + (f"verify {verify_ms:.1f} ms" if args.verify else "checksums not verified (--no-verify)"))
        q = info.get("query")
        if q:
            sel = f" in {q['n_documents_selected']} document(s) matching {' '.join(q['filter'])}" if q["filter"] else ""
            print(f"  query       longest match {q['match_length']} of {q['n_context_tokens']} tokens{sel}: "
                  f"{q['matched_text']!r}, count {'~' if q['estimated'] else ''}{q['count']} ({q['query_us']:.0f} us)")
            for c in q["continuations"]:
                print(f"    {c['text']!r:>20}  count {'~' if q['estimated'] else ''}{c['count']:<8} last at {c['last_end']} ({c['document']})")
    else:
        print(json.dumps(info))
    return 0
