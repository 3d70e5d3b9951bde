import sys

from agentbox.cli import main

if __name__ == "__main__":
    # The one-file build starts the analysis process ("spawn") as this executable
    # again; freeze_support makes that child run the analysis, not the CLI. Only
    # there: `python -m agentbox` starts without multiprocessing.
    if getattr(sys, "frozen", False):
        import multiprocessing

        multiprocessing.freeze_support()
    main()
