#!/usr/bin/env python3
"""Turns one stage of a Dockerfile into a shell script that does the same in a root file system, so a
test can run packaging/slinky/Dockerfile's instructions without Docker or a registry and cannot drift
from them: every instruction of the stage is translated, and one this tool does not know fails.

    dockerfile_stage.py DOCKERFILE STAGE

STAGE is a stage name (`FROM ... AS build`) or "final" for the last stage. The script runs inside the
root that stands in for the base image (FROM is not run), as root, with the build context at
$DOCKER_CONTEXT and the stages named in `COPY --from=NAME` under $DOCKER_STAGES/NAME. Translations:
ARG NAME=DEFAULT -> exported, and the caller's environment wins (like --build-arg); ENV -> exported;
WORKDIR -> mkdir -p and cd; COPY SRC... DEST -> cp -a from the context or the stage (sources may be
globs, DEST ending in / is a directory); RUN CMD -> /bin/sh -c CMD in the WORKDIR, the script stopping
at the first failure as `docker build` does. ${VAR} in ARG defaults, COPY and WORKDIR is expanded by
the shell, as Docker expands it.
"""
import re
import shlex
import sys


def logical_lines(text):
    """Instructions with their continuation lines joined; comments and blank lines dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not cur and (not stripped or stripped.startswith("#")):
            continue
        if cur and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        out.append((cur + raw).strip())
        cur = ""
    if cur:
        out.append(cur.strip())
    return out


def stages(lines):
    """[(name, [instructions])] in order; a stage without AS gets its index as name."""
    result = []
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            m = re.search(r"\s+AS\s+(\S+)\s*$", rest, re.I)
            result.append((m.group(1) if m else str(len(result)), []))
        elif result:
            result[-1][1].append(line)
        elif word.upper() != "ARG":  # ARGs before the first FROM only parametrise FROM
            sys.exit(f"dockerfile_stage: '{word}' before the first FROM")
    return result


def shell_word(word):
    """A Dockerfile word for the shell: variables expand, globs stay unquoted, nothing else splits."""
    return re.sub(r"[^A-Za-z0-9_./*?${}:=@%+-]", lambda m: "\\" + m.group(0), word)


def translate(instructions):
    out = ["set -e", 'cd /']
    for line in instructions:
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "ARG":
            name, eq, default = rest.partition("=")
            if eq:
                out.append(f': "${{{name}={shell_word(default)}}}"')
            out.append(f"export {name}")
        elif word == "ENV":
            name, eq, value = rest.partition("=")
            if not eq:
                name, _, value = rest.partition(" ")
            out.append(f"export {name}={shell_word(value.strip())}")
        elif word == "WORKDIR":
            out.append(f"mkdir -p {shell_word(rest)} && cd {shell_word(rest)}")
        elif word == "COPY":
            args = rest.split()
            origin = '"$DOCKER_CONTEXT"'
            while args and args[0].startswith("--"):
                opt = args.pop(0)
                if opt.startswith("--from="):
                    origin = f'"$DOCKER_STAGES/{opt[len("--from="):]}"'
                else:
                    sys.exit(f"dockerfile_stage: COPY option {opt} is not supported")
            if len(args) < 2:
                sys.exit(f"dockerfile_stage: COPY needs a source and a destination: {line}")
            *srcs, dest = args
            if dest.endswith("/") or len(srcs) > 1:
                out.append(f"mkdir -p {shell_word(dest)}")
            else:
                out.append(f"mkdir -p \"$(dirname {shell_word(dest)})\"")
            for src in srcs:
                if src in (".", "./"):
                    out.append(f"mkdir -p {shell_word(dest)} && cp -a {origin}/. {shell_word(dest)}")
                else:
                    out.append(f"cp -a {origin}/{shell_word(src.lstrip('/'))} {shell_word(dest)}")
        elif word == "RUN":
            if rest.startswith("["):
                sys.exit(f"dockerfile_stage: exec-form RUN is not supported: {line}")
            out.append(f"echo {shlex.quote('+ RUN ' + rest)}")
            out.append(f"/bin/sh -c {shlex.quote(rest)}")
        elif word in ("LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "USER", "VOLUME", "STOPSIGNAL", "HEALTHCHECK"):
            out.append(f"# {word} does not change the file system: {rest}")
            if word == "USER":
                sys.exit(f"dockerfile_stage: USER in a stage is not supported: {line}")
        else:
            sys.exit(f"dockerfile_stage: unknown instruction '{word}': {line}")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: dockerfile_stage.py DOCKERFILE STAGE")
    found = stages(logical_lines(open(sys.argv[1]).read()))
    if not found:
        sys.exit(f"dockerfile_stage: {sys.argv[1]} has no FROM")
    want = sys.argv[2]
    chosen = found[-1] if want == "final" else next((s for s in found if s[0] == want), None)
    if chosen is None:
        sys.exit(f"dockerfile_stage: no stage '{want}' in {sys.argv[1]} (stages: {', '.join(s[0] for s in found)})")
    sys.stdout.write(translate(chosen[1]))


if __name__ == "__main__":
    main()
