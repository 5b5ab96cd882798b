"""The benchmark's outputs: ``results.json`` (every row, each with the
fingerprint of the code it measured: :func:`.record.row_code`),
``results.md`` (:mod:`.report`'s tables) and ``results.png``
(:mod:`.plot`)."""
import json
import os.path as osp
import sys

from .machine import machine
from .plot import plot
from .record import row_code
from .report import write_table
from .runs import combine


def write_outputs(runs, matmul, args) -> dict:
    """Write the three outputs from ``runs`` (rows by measurement, one per
    round); returns what ``results.json`` holds."""
    results = [dict(combine(rounds), code=row_code(model))
               for (model, *_), rounds in runs.items()]
    found = machine(args.device)
    doc = dict(matmul=matmul, threads=args.threads, device=args.device,
               machine=found, argv=sys.argv[1:], results=results,
               all_rounds=[r for rs in runs.values() for r in rs])
    with open(osp.join(args.out_dir, 'results.json'), 'w') as f:
        json.dump(doc, f, indent=1)
    write_table(results, matmul, args, osp.join(args.out_dir, 'results.md'),
                found)
    plot(results, osp.join(args.out_dir, 'results.png'))
    return doc
