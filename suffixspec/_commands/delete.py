"""`suffixspec delete INDEX [--id ID]... [--filter KEY=VALUE]...`: mark documents deleted."""

from __future__ import annotations

import json


def add_parser(subparsers):
    p = subparsers.add_parser("delete", help="mark documents of an index deleted (by id and/or tags); merge drops them",
                              description="Mark documents deleted: queries skip them at once; `suffixspec merge` "
                                          "drops them for good. --id and --filter select together: a document is "
                                          "deleted when its id is one of the --id values (if any) and it carries "
                                          "every --filter tag (if any). An unknown id, or a selection matching no "
                                          "document, is an error and changes nothing.")
    p.add_argument("index", metavar="INDEX", help="the corpus index to delete documents from")
    p.add_argument("--id", action="append", default=None, metavar="ID", dest="ids",
                   help="id of the document(s) to delete (repeatable; every document with that id; this or --filter is required)")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                   help="delete documents tagged KEY=VALUE (repeatable: all must hold); id=NAME selects by document id "
                        "(this or --id is required)")
    p.add_argument("--dry-run", action="store_true", help="report what would be deleted, change nothing")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS for another writer of INDEX to finish (default 0: fail at once)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..corpus import delete_selected
    from ..errors import BadInputError
    from .args import check_writer_args, load_writer_modules, parse_filters

    tags = parse_filters(args.filter)
    ids = list(args.ids) if args.ids is not None else None
    if "id" in tags:
        ids = (ids or []) + [tags.pop("id")]
    if ids is None and not tags:
        raise BadInputError("delete: expected --id ID or --filter KEY=VALUE (deleting every document needs an explicit filter)")
    check_writer_args(args)
    load_writer_modules()
    # the selection is resolved under the index's writer lock, against the index as it is then
    r = delete_selected(args.index, ids=ids, tags=tags or None, wait=args.wait, dry_run=args.dry_run)
    report = {"index": str(args.index), "selected": r.selected, "newly_deleted": r.newly_deleted,
              "n_deleted": r.n_deleted, "n_documents": r.n_documents, "dry_run": args.dry_run, "document_ids": r.document_ids}
    if args.json:
        print(json.dumps(report))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        already = r.selected - r.newly_deleted
        print(f"{args.index}: {verb} {r.newly_deleted} document(s)" + (f" ({already} already deleted)" if already else "")
              + f"; {r.n_deleted} of {r.n_documents} documents deleted" + (" (dry run: nothing changed)" if args.dry_run else ""))
    return 0
