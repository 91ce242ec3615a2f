"""Run one page's copyable blocks in order, in the current folder, as a reader would paste them.

    python -m support.doc_page_runner STEPS.json

STEPS.json is a list of {"where", "kind", "text", "target", "status"}: `python` blocks are
executed in one namespace (a later block sees an earlier block's names, as in one session),
`save` blocks are written to `target`, `command` lines run in bash and must exit with
`status`. The first failure prints the block's page and line and exits 1.
"""
import json
import subprocess
import sys
import time
import traceback

COMMAND_TIMEOUT_S = 150


def run_python(step, namespace):
    exec(compile(step["text"], step["where"], "exec"), namespace)


def run_command(step):
    finished = subprocess.run(["bash", "-c", step["text"]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=COMMAND_TIMEOUT_S)
    if finished.returncode != step["status"]:
        tail = "\n".join(finished.stdout.splitlines()[-30:])
        raise AssertionError(f"`{step['text']}` exited {finished.returncode}, the page expects {step['status']}:\n{tail}")


def save(step):
    with open(step["target"], "w", encoding="utf-8") as file:
        file.write(step["text"])


def main(steps_file):
    with open(steps_file, encoding="utf-8") as file:
        steps = json.load(file)
    namespace = {"__name__": "__main__"}
    for step in steps:
        started = time.perf_counter()
        try:
            if step["kind"] == "python":
                run_python(step, namespace)
            elif step["kind"] == "command":
                run_command(step)
            else:
                save(step)
        except BaseException:  # noqa: B902 - report any failure (SystemExit included) with its block
            print(f"DOC BLOCK FAILED: {step['where']}", flush=True)
            traceback.print_exc()
            sys.stdout.flush()
            sys.exit(1)
        print(f"ok in {time.perf_counter() - started:.1f} s: {step['where']} {step['text'][:60]!r}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
