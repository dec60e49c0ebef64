"""README's GPU status agrees with docs/gpu.md's.

Usage: python3 tests/docs/gpu_status_check.py README.md docs/gpu.md

docs/gpu.md opens with one "**Status:**" line. Each GPU run it names (a device such as H100 or
H200 and a date YYYY-MM-DD) must be named in README.md's GPU paragraph (the one that mentions
docs/gpu.md), and README must not say the GPU path has not run when gpu.md names a run. Exits 1
naming what differs.
"""
import re
import sys

DEVICE = re.compile(r"\b([A-Z]\d{2,3}[A-Z]?)\b")  # H100, H200, A100, L40S
DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")


def main(readme_path, gpu_path):
    gpu = open(gpu_path, encoding="utf-8").read()
    status = next((line for line in gpu.splitlines() if line.startswith("**Status:**")), None)
    if status is None:
        print(f"{gpu_path}: no '**Status:**' line")
        return 1
    readme = open(readme_path, encoding="utf-8").read()
    paragraphs = [p for p in re.split(r"\n\s*\n", readme) if "docs/gpu.md" in p and "GPU" in p]
    text = " ".join(paragraphs)
    problems = []
    for kind, pattern in (("device", DEVICE), ("date", DATE)):
        for value in sorted(set(pattern.findall(status))):
            if value not in text:
                problems.append(f"{readme_path} does not name the {kind} {value} of {gpu_path}'s "
                                f"status ({status.strip()})")
    ran = DATE.search(status) is not None
    if ran and re.search(r"has not run on a GPU|never run on a GPU|not yet run on a GPU", text):
        problems.append(f"{readme_path} says the GPU path has not run, but {gpu_path}'s status "
                        f"names a run ({status.strip()})")
    if not paragraphs:
        problems.append(f"{readme_path} has no paragraph on the GPU path linking docs/gpu.md")
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{readme_path} and {gpu_path} agree on the GPU status")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
