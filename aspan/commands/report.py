"""`aspan report RUN_DIR -o report.html`: one offline HTML page that states a run's finding, with its figures, views,
tables and settings; `--images png|svg` writes the run's key figures as static images instead (for READMEs)."""
from __future__ import annotations

import argparse

from ..errors import UsageError
from .argtypes import output_file
from .grammar import Once, add_deprecated

HELP = "write one self-contained HTML report (offline) for a run directory"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan report runs/rank -o rank.html",
    "aspan report runs/demo --images png",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan report` to its parser."""
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="run directory (run.json, summary.json, *.csv, figures/, views/)")
    parser.add_argument("-o", "--output", dest="out", type=output_file, default=None, metavar="FILE", action=Once,
                        help="output HTML file, given once (when not given: RUN_DIR/report.html)")
    add_deprecated(parser, "--out", "-o/--output", dest="out", type=output_file, metavar="FILE")
    parser.add_argument("--title", default=None, help="page title")
    parser.add_argument("--images", choices=("png", "svg"), default=None,
                        help="instead of the page, write the key figures (the first of each claim of the finding) as "
                             "static images into RUN_DIR/images/; needs kaleido and Chromium")


def run(args: argparse.Namespace) -> int:
    """Run `aspan report` with the parsed arguments; the exit code."""
    from ..report import write_images, write_report

    if args.images:
        if args.out is not None:
            raise UsageError("--images writes into RUN_DIR/images/; -o names the HTML page, give one or the other")
        for path in write_images(args.run_dir, args.images):
            print(path)
        return 0
    path = write_report(args.run_dir, args.out, title=args.title)
    print(path)
    return 0
