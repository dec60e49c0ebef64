#!/usr/bin/env python3
"""Usage: code_in_source_check.py SOURCE MARKDOWN[:FIRST] ...

The docs show what a user writes by quoting a program: every line of each ```cpp block of
MARKDOWN (only the first block with :FIRST) must be a line of SOURCE, in the same order, compared
without leading and trailing blanks. A line "// ..." marks what the quote leaves out and is not
compared. Fails naming the document, the block's line and the text when the docs and the program
have drifted apart."""
import sys


def cpp_blocks(path):
    blocks, block, start = [], None, 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if block is None and text == "```cpp":
                block, start = [], number
            elif block is not None and text == "```":
                blocks.append(block)
                block = None
            elif block is not None:
                block.append((number, text))
    if block is not None:
        sys.exit(f"{path}:{start}: a ```cpp block that never ends")
    return blocks


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source = sys.argv[1]
    with open(source, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    failures = 0
    for argument in sys.argv[2:]:
        path, _, which = argument.partition(":")
        blocks = cpp_blocks(path)
        if not blocks:
            sys.exit(f"{path}: no ```cpp block")
        if which == "FIRST":
            blocks = blocks[:1]
        quoted = 0
        for block in blocks:
            at = 0  # the next source line a quoted line may match
            for number, text in block:
                if not text or text.startswith("// ..."):
                    continue
                try:
                    at = lines.index(text, at) + 1
                    quoted += 1
                except ValueError:
                    where = "at all" if text not in lines else "after the previous quoted line"
                    print(f"{path}:{number}: not in {source} {where}: {text}")
                    failures += 1
        print(f"{path}: {len(blocks)} block(s), {quoted} line(s) found in {source}")
    sys.exit(1 if failures else 0)


main()
