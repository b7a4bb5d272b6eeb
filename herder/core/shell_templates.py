"""A `shell = true` job type's script with its `{field}` placeholders turned into references
to environment variables (`"${HERDER_P_TITLE}"`) that carry the payload's values.

A value is never spliced into the script's text, so the shell never parses it: the script
is the same for every submit and the values reach it as `HERDER_P_<FIELD>` in the job's env.
An expanded variable is still code where the script hands text to an evaluator (`eval`,
`sh -c "..."`, `flock -c`, `ssh`, `sudo`, `xargs`, a heredoc fed to `python`, bash's
arithmetic), and still chooses the program in a command's place, so `shell_problem`
refuses at load a placeholder used in such a construct. That check is lexical and
conservative: it reads the script's words, not what it does at run time. A word that a
placeholder opens is an argument the payload starts, so `render_shell` refuses at submit
a value that would make it start with '-'.

Pure functions over the template text: the config load (refusals) and the submit path (the
rendered script and its variables) read the same scan.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import msgspec

from herder.core.errors import InputError
from herder.core.templates import leading_dash_refusal, placeholders, text

VARIABLE_PREFIX = "HERDER_P_"
"""The job's env entries that carry a shell job type's payload values."""

_ASCII_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_HEREDOC = re.compile(r"<<(-?)[ \t]*(?:'([^'\n]*)'|\"([^\"\n]*)\"|\\?([A-Za-z0-9_.-]+))")
_WORD_START = " \t\n;&|(`"
_WORD_END = " \t\n;&|()<>`"
_SEPARATORS = ";&|()\n`"
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\[[^]]*\])?\+?=")
_SUBSCRIPT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\[[^]]*$")
_CONTEXTS = {"DQ": "dquote", "SQ": "squote"}

EVALUATORS = ("eval", "source", ".", "ssh", "su", "sudo", "doas", "runuser", "pkexec",
              "xargs", "parallel", "watch", "trap", "expect", "script", "flock", "at", "batch",
              "tmux", "screen", "sg", "setsid", "nsenter", "unshare", "chroot")
"""Commands that run their arguments (or text built from them) as shell code: a
placeholder anywhere in their statement is refused."""
INTERPRETERS = ("sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "yash", "fish", "csh",
                "tcsh", "busybox", "python", "python2", "python3", "perl", "ruby", "node",
                "nodejs", "deno", "bun", "php", "lua", "luajit", "Rscript", "tclsh", "osascript",
                "pwsh", "powershell", "awk", "gawk", "mawk", "nawk", "sed", "jq")
"""Programs whose program text comes from an argument or stdin: in their statement a
placeholder must be a whole unquoted argument of its own, not the one after `-c` or `-e`
(anything else could be inside the program's text), and nothing may pipe into them."""


def _word(names: Collection[str], extra: str = "") -> re.Pattern[str]:
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?:^|[\s;&|()`{{}}!])(?:[\w.-]*/)*({alternatives}{extra})"
                      r"(?=$|[\s;&|()`<>])")


_EVALUATOR = _word([name for name in EVALUATORS if name != "."])
_DOT = re.compile(r"(?:^|[\s;&|(`{}])(\.)(?=\s)")
_INTERPRETER = _word(INTERPRETERS, "|python[0-9.]+")
_CODE_OPTION = re.compile(
    r"^(?:-[A-Za-z]*[ceExS]|--(?:eval|command|exec|expression|split-string))$")
"""An option whose argument many programs run as code (`sh -c`, `flock -c`, `env -S`,
`git rebase -x`, `rsync -e`): the word after it is never a plain value."""
_ARITHMETIC = re.compile(r"\[\[|\(\(|\$\[|(?:^|[\s;&|()`!])(let|(?:declare|typeset|local|export|"
                         r"readonly)(?:\s+[-+]\w+)*\s+[-+]\w*i\w*)(?=$|[\s;&|()`<>])")
"""bash's arithmetic contexts, which evaluate `a[$(cmd)]` in an expanded value."""

KEYWORDS = frozenset({"if", "then", "else", "elif", "while", "until", "do", "!", "{"})
"""Reserved words after which the next word names a command."""
WRAPPERS: dict[str, tuple[int, frozenset[str]]] = {
    name: (positional, frozenset(options)) for name, positional, options in [
        ("exec", 0, ["-a"]), ("command", 0, []), ("builtin", 0, []),
        ("env", 0, ["-u", "-C", "--unset", "--chdir"]), ("nohup", 0, []),
        ("time", 0, ["-f", "-o", "--format", "--output"]),
        ("timeout", 1, ["-s", "-k", "--signal", "--kill-after"]),
        ("nice", 0, ["-n", "--adjustment"]), ("stdbuf", 0, ["-i", "-o", "-e"]),
        ("xargs", 0, ["-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s"]),
        ("setsid", 0, []), ("chroot", 1, ["--userspec", "--groups"]),
        ("flock", 1, ["-w", "-E", "--timeout", "--conflict-exit-code"]),
        ("nsenter", 0, ["-t", "--target"]), ("unshare", 0, []), ("sg", 1, []),
        ("sudo", 0, ["-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"]),
        ("doas", 0, ["-u", "-C"])]}
"""Programs that run the command named by their first other word (after their options
and `positional` arguments such as timeout's duration): that word is a command's place."""


def command_position(words: Sequence[str]) -> bool:
    """Whether the word after `words` (a simple command's words so far) names the program:
    first, or after a reserved word, an assignment or a wrapper and its options."""
    wrapper: tuple[int, frozenset[str]] | None = None
    positional, takes_argument = 0, False
    for word in words:
        name = word.rsplit("/", 1)[-1]
        if takes_argument:
            takes_argument = False
        elif wrapper is None and (word in KEYWORDS or _ASSIGNMENT.match(word)):
            continue
        elif name in WRAPPERS:
            wrapper = WRAPPERS[name]
            positional = wrapper[0]
        elif wrapper is None:
            return False
        elif word.startswith("-") and word != "-":
            takes_argument = word in wrapper[1]
        elif "=" in word:  # env's NAME=value
            continue
        elif positional:
            positional -= 1
        else:
            return False
    return True

_PIPED_INTERPRETER = re.compile(r"\|[\s&]*(?:[\w.-]*/)*(" + "|".join(
    re.escape(name) for name in INTERPRETERS) + r"|python[0-9.]+)(?=$|[\s;&|()`<>])")


class Placeholder(msgspec.Struct, frozen=True):
    """One `{field}` in a script: where it stands (`word`: unquoted; `program`: a whole word
    in a command's place; `dquote`, `squote`, `heredoc`, `quoted_heredoc`, `comment`),
    whether it is a whole word (an argv item, so an option position), its line, and its
    statement's code (quoted text blanked)."""

    name: str
    context: str
    whole_word: bool
    line: int
    statement: str
    preceded_by: str = ""
    """The script character just before it, when that changes its meaning (`$`, `\\`)."""
    argument: bool = False
    """A whole word at the top of its statement (not in `$(...)`), not after `-c`/`-e`:
    an argument of its own even to an interpreter."""
    run: int = -1
    """When it opens a word (quoted or not, `"{a}"`, `{a}{b}`): the index among the
    script's placeholders of the first in that word; else -1."""
    tail: str = ""
    """For the first placeholder of a run: the word's first literal character after the
    run (`{a}-x`: '-'), '' when the word ends there."""
    option: str = ""
    """The option (`-c`, `-x`, `-S`, ...) just before its word, whose argument is code."""
    arithmetic: bool = False
    """Inside `${...}` or an array subscript, which bash evaluates arithmetically."""


def variable(name: str) -> str:
    """The environment variable that carries payload field `name` to a shell script."""
    return VARIABLE_PREFIX + name.upper()


def scan(script: str) -> list[str | Placeholder]:
    """The script as literal text (braces unescaped) and placeholders; ValueError for a
    brace that is neither `{{`, `}}` nor `{name}`."""
    return _Scanner(script).run()


class _Scanner:
    """A small lexer for the shell's quoting: quotes, `$(...)`, backticks, comments and
    heredocs. It tracks what decides how a placeholder must be referenced, nothing more."""



    def __init__(self, script: str) -> None:
        self.script = script
        self.parts: list[str | int] = []  # literal text, or an index into records
        self.literal: list[str] = []
        self.code: list[str] = []  # the script with quoted text, comments and bodies blanked
        self.records: list[dict[str, Any]] = []
        self.line = 1
        self.statements: list[str] = []
        self.statement_start = 0
        self.open: list[int] = []  # records in the statement being read
        self.stack: list[list[Any]] = [["N", 0]]  # N, DQ, SQ, SUB ($(...)), BQ (`...`)
        # The simple command being read: its finished words, the current word's text
        # (a placeholder as "{}"), and whether that word is empty, opened by placeholders
        # (the run from record `run`) or has other text.
        self.words: list[str] = []
        self.current: list[str] = []
        self.state = "empty"
        self.opening = -1

    def run(self) -> list[str | Placeholder]:
        script, index, stack = self.script, 0, self.stack
        pending: list[tuple[str, bool, bool]] = []
        while index < len(script):
            char = script[index]
            kind = stack[-1][0]
            if char in "{}":
                index = self.brace(index, _CONTEXTS.get(kind, "word"))
            elif char == "\n":
                self.emit(char, char)
                self.line += 1
                index += 1
                if pending:
                    index = self.heredocs(index, pending)
                    pending = []
                if len(stack) == 1:
                    self.end_statement()
            elif kind == "SQ":
                self.emit(char, " ")
                if char == "'":
                    stack.pop()
                index += 1
            elif char == "\\":
                following = script[index + 1: index + 2]
                if following in ("{", "}"):  # the brace is read on its own
                    self.emit(char, " ")
                    index += 1
                    continue
                self.emit(char + following, "  " if kind == "DQ" else char + following)
                self.line += following == "\n"
                index += 2
            elif kind == "DQ":
                index = self.double_quoted(index, stack)
            else:
                index = self.code_char(index, stack, pending)
        self.end_statement()
        self.flush()
        return self.finish()

    def double_quoted(self, index: int, stack: list[list[Any]]) -> int:
        script, char = self.script, self.script[index]
        if char == '"':
            stack.pop()
            self.emit(char, char)
        elif script.startswith("$(", index):
            self.enter("SUB")
            self.emit("$(", "$(", track=False)
            return index + 2
        elif char == "`":
            self.enter("BQ")
            self.emit(char, char, track=False)
        else:
            self.emit(char, " ")
        return index + 1

    def code_char(self, index: int, stack: list[list[Any]],
                  pending: list[tuple[str, bool, bool]]) -> int:
        """One character outside quotes: at the top, in `$(...)` or in backticks."""
        script, char, kind = self.script, self.script[index], stack[-1][0]
        if char in "'\"":
            stack.append(["SQ" if char == "'" else "DQ", 0])
        elif script.startswith("$(", index):
            self.enter("SUB")
            self.emit("$(", "$(", track=False)
            return index + 2
        elif char == "`":
            if kind == "BQ":
                self.leave()
            else:
                self.enter("BQ")
            self.emit(char, char, track=False)
            return index + 1
        elif char == "(" and kind == "SUB":
            stack[-1][1] += 1
        elif char == ")" and kind == "SUB":
            if stack[-1][1]:
                stack[-1][1] -= 1
            else:
                self.leave()
                self.emit(char, char, track=False)
                return index + 1
        elif char == "#" and (index == 0 or script[index - 1] in " \t\n;&|()"):
            end = script.find("\n", index)
            return self.comment(index, len(script) if end < 0 else end)
        elif script.startswith("<<", index) and not script.startswith("<<<", index):
            match = _HEREDOC.match(script, index)
            if match:
                quoted = (match.group(4) is None
                          or script[match.start(4) - 1: match.start(4)] == "\\")
                delimiter = next(group for group in match.groups()[1:] if group is not None)
                pending.append((delimiter, quoted, match.group(1) == "-"))
                self.emit(match.group(0), match.group(0))
                return match.end()
        self.emit(char, char)
        return index + 1

    def emit(self, text: str, code: str, track: bool = True) -> None:
        self.literal.append(text)
        self.code.append(code)
        if not track or not text or text in ('"', "'", "\\\n"):  # quotes and line joins add no text
            return
        if self.stack[-1][0] in ("DQ", "SQ") or text[0] not in _WORD_END:
            self.content(text[1:2] if text[0] == "\\" else text)
            return
        if self.state != "empty":
            self.words.append("".join(self.current))
        self.current, self.state, self.opening = [], "empty", -1
        if text[0] in _SEPARATORS:
            self.words = []

    def content(self, text: str) -> None:
        """Text of the current word other than a placeholder."""
        if self.state == "lead":
            self.records[self.opening]["tail"] = text[:1]
        self.state = "content"
        self.current.append(text)

    def enter(self, kind: str) -> None:
        """A substitution: a command of its own inside the current word."""
        self.content("$")
        self.stack.append([kind, 0, (self.words, self.current, self.state, self.opening)])
        self.words, self.current, self.state, self.opening = [], [], "empty", -1

    def leave(self) -> None:
        self.words, self.current, self.state, self.opening = self.stack.pop()[2]

    def flush(self) -> None:
        if self.literal:
            self.parts.append("".join(self.literal))
            self.literal = []

    def end_statement(self) -> None:
        code = "".join(self.code)
        self.statements.append(code[self.statement_start:])
        for record in self.open:
            self.records[record]["statement"] = len(self.statements) - 1
        self.open = []
        self.statement_start = len(code)

    def brace(self, index: int, context: str) -> int:
        script = self.script
        if script.startswith("{{", index) or script.startswith("}}", index):
            self.emit(script[index], script[index] if context == "word" else " ")
            return index + 2
        match = _PLACEHOLDER.match(script, index)
        if script[index] == "}" or match is None:
            raise ValueError(f"line {self.line}: a single {script[index]!r}; escape literal "
                             "braces as {{ and }}")
        before = script[index - 1: index]
        after = script[match.end(): match.end() + 1]
        whole = context == "word" and (before == "" or before in _WORD_START) and (
            after == "" or after in _WORD_END)
        record: dict[str, Any] = {}
        if context in ("word", "dquote"):
            record = self.word_record(whole, script[script.rfind("\n", 0, index) + 1: index])
        self.placeholder(match.group(1), record.pop("context", context), whole, before,
                         **record)
        return match.end()

    def word_record(self, whole: bool, line: str) -> dict[str, Any]:
        """Where a placeholder in a word stands among the words of its simple command."""
        option = self.words[-1] if self.words and _CODE_OPTION.match(self.words[-1]) else ""
        record: dict[str, Any] = {
            "option": option, "argument": whole and len(self.stack) == 1 and not option,
            "arithmetic": bool(re.search(r"\$\{\{[^}]*$", line)
                               or _SUBSCRIPT.match("".join(self.current)))}
        if self.state != "content":
            if self.state == "empty":
                self.opening, self.state = len(self.records), "lead"
            record["run"] = self.opening
        current = "".join(self.current)
        if not _ASSIGNMENT.match(current) and command_position(self.words):
            record["context"] = "program"
        self.current.append("{}")
        return record

    def placeholder(self, name: str, context: str, whole: bool, before: str,
                    argument: bool = False, run: int = -1, option: str = "",
                    arithmetic: bool = False) -> None:
        self.flush()
        self.parts.append(len(self.records))
        if context != "comment":
            self.open.append(len(self.records))
        self.records.append({"name": name, "context": context, "whole": whole,
                             "line": self.line, "statement": None, "argument": argument,
                             "before": before if before in ("$", "\\") else "",
                             "run": run, "tail": "", "option": option,
                             "arithmetic": arithmetic})
        self.code.append(" X ")

    def comment(self, index: int, end: int) -> int:
        for piece in re.split(r"(\{\{|\}\}|\{[^{}]*\})", self.script[index:end]):
            if piece in ("{{", "}}"):
                self.emit(piece[0], " ")
            elif len(piece) > 2 and piece[0] == "{" and piece[-1] == "}":
                self.placeholder(piece[1:-1], "comment", False, "")
            elif "{" in piece or "}" in piece:
                raise ValueError(f"line {self.line}: a single brace; escape literal braces "
                                 "as {{ and }}")
            else:
                self.emit(piece, " " * len(piece))
        return end

    def heredocs(self, index: int, pending: list[tuple[str, bool, bool]]) -> int:
        """Read the bodies of the heredocs opened on the line just ended."""
        script = self.script
        for delimiter, quoted, strip in pending:
            context = "quoted_heredoc" if quoted else "heredoc"
            while index < len(script):
                end = script.find("\n", index)
                end = len(script) if end < 0 else end
                line = script[index:end]
                done = (line.lstrip("\t") if strip else line) == delimiter
                position = index
                while position < end:
                    if script[position] in "{}" and not done:
                        position = self.brace(position, context)
                    else:
                        self.emit(script[position], " ")
                        position += 1
                index = end
                if end < len(script):
                    self.emit("\n", "\n")
                    self.line += 1
                    index += 1
                if done:
                    break
        return index

    def finish(self) -> list[str | Placeholder]:
        parts: list[str | Placeholder] = []
        for part in self.parts:
            if isinstance(part, str):
                parts.append(part)
                continue
            record = self.records[part]
            statement = record["statement"]
            parts.append(Placeholder(
                record["name"], record["context"], record["whole"], record["line"],
                "" if statement is None else self.statements[statement], record["before"],
                record["argument"], record["run"], record["tail"], record["option"],
                record["arithmetic"]))
        return parts


def shell_problem(script: str) -> str | None:
    """Why a shell job type's script cannot take payload values safely, or None."""
    try:
        parts = scan(script)
    except ValueError as exc:
        return str(exc)
    seen: dict[str, str] = {}
    for part in parts:
        if not isinstance(part, Placeholder):
            continue
        name, at = part.name, f"{{{part.name}}} on line {part.line}"
        if not _ASCII_NAME.match(name):
            return (f"{at} is not a plain ASCII name, so it cannot become an environment "
                    "variable; use letters, digits and _")
        other = seen.setdefault(variable(name), name)
        if other != name:
            return (f"{{{other}}} and {{{name}}} would both be ${variable(name)}; rename one")
        if part.context == "comment":
            continue
        if part.preceded_by == "$":
            return (f"{at} follows a '$'; for a shell variable write ${{{{NAME}}}}, for "
                    "the payload value drop the '$'")
        if part.preceded_by == "\\":
            return f"{at} follows a backslash, which would escape herder's reference; remove it"
        if part.context == "squote":
            return (f"{at} is inside single quotes, where the shell expands nothing; move it "
                    "out of the quotes (herder passes the value itself, quoted)")
        if part.option:
            return (f"{at} is in the word after `{part.option}`, whose argument many programs "
                    "run as code (`flock -c`, `env -S`, `git rebase -x`, `rsync -e`); pass the "
                    "value another way (a long option such as --name={field}, or `--` before "
                    "it), or export the field and handle it in the script yourself")
        if part.arithmetic or _ARITHMETIC.search(part.statement):
            return (f"{at} is in an arithmetic context (`[[ ]]`, `(( ))`, `$(( ))`, `let`, "
                    "`declare -i`, `${{...}}`, an array subscript), where bash evaluates "
                    "`a[$(cmd)]` in the value; compare or compute with a program instead "
                    "(`test`, `expr`), or validate the value before using it")
        if part.context == "program":
            return (f"{at} is in a command's place, so the payload would choose the program; "
                    "name the program in herder.toml and pass the value as its argument")
        if part.context == "quoted_heredoc":
            return (f"{at} is inside a quoted heredoc (<<'EOF'), where the shell expands "
                    "nothing; use an unquoted delimiter (<<EOF)")
        danger = _danger(part)
        if danger is not None:
            return (f"{at} is used with {danger}, which would run the value as code; pass it "
                    "as a plain argument of a program instead, or export the field "
                    f"(export = [\"{name}\"]) and handle $HERDER_PAYLOAD_{name.upper()} in the "
                    "script yourself")
    return None


ARGV_EVALUATORS = ("ssh", "su", "runuser", "watch", "script", "parallel", "expect", "tmux",
                   "screen", "sg", "at", "batch")
"""Programs that join their arguments into a shell command line (ssh's remote command,
`su -c`, `watch`, `tmux new "vim x"`) or read one (`at`): in an argv list, no item after
them may hold a placeholder."""
ARGV_CODE_PROGRAMS = ("flock", "env", "setsid", "nsenter", "unshare", "chroot", "git")
"""Programs besides the interpreters whose `-c`/`-S`/`-x`-style option takes code
(`flock -c`, `env -S`, `git -c core.sshCommand=...`, `git rebase -x`)."""


def argv_problem(parts: Sequence[str | Sequence[str]]) -> str | None:
    """Why an argv job type would hand a payload value to a program as code, or None: a
    placeholder in the item after an interpreter's `-c`/`-e` (`["sh", "-c", "echo {x}"]`
    splices the value into a script), or after a program that runs its arguments through
    a shell (`["ssh", "host", "make", "{target}"]`). A value as an argument of its own
    (`["sh", "-c", "echo \"$1\"", "sh", "{x}"]`) is data."""
    items = [(f"command.{index}", part) if isinstance(part, str) else
             (f"command.{index}.{inner}", item)
             for index, part in enumerate(parts)
             for inner, item in ([(0, part)] if isinstance(part, str) else enumerate(part))]
    interpreter: str | None = None
    evaluator: str | None = None
    previous = ""
    for position, (where, item) in enumerate(items):
        program = item.rsplit("/", 1)[-1]
        names = placeholders(item)
        if names and evaluator is not None:
            return (f"{where}: {{{names[0]}}} is an argument of `{evaluator}`, which runs its "
                    "arguments as a shell command line; pass the value in env and let the "
                    "remote or inner command read it, or drop the placeholder")
        if names and interpreter is not None and _CODE_OPTION.match(previous):
            return (f"{where}: {{{names[0]}}} is inside the code text of `{interpreter} "
                    f"{previous}`, where the value would be code; pass it as an argument of "
                    f"its own (e.g. [\"sh\", \"-c\", \"echo \\\"$1\\\"\", \"sh\", "
                    f"\"{{{names[0]}}}\"]) or through env")
        if names and command_position([item for _, item in items[:position]]):
            return (f"{where}: {{{names[0]}}} would let the payload choose the program; name "
                    "it in herder.toml and pass the value as an argument")
        if program in ARGV_EVALUATORS:
            evaluator = program
        if (program in INTERPRETERS or program in ARGV_CODE_PROGRAMS
                or re.fullmatch(r"python[0-9.]+", program)):
            interpreter = program
        previous = item
    return None


def _danger(part: Placeholder) -> str | None:
    """The construct in the placeholder's statement that evaluates text, or None."""
    statement = part.statement
    match = _EVALUATOR.search(statement) or _DOT.search(statement)
    if match:
        return f"`{match.group(1)}`"
    match = _PIPED_INTERPRETER.search(statement)
    if match:
        return f"a pipe into `{match.group(1)}`"
    match = _INTERPRETER.search(statement)
    if match and not part.argument:
        return (f"`{match.group(1)}` (not a whole argument of its own, it may be inside the "
                "program's text)")
    return None


def render_shell(script: str, context: Mapping[str, Any], where: str,
                 keep: Collection[str] = (), option_fields: Collection[str] = (),
                 ) -> tuple[str, dict[str, str]]:
    """The script with each placeholder a variable reference, and the variables' values
    (those in `keep` are set later, on the host). A word that starts with placeholders
    (`{p}`, `"{p}"`, `{a}{b}`) is an argument whose text the payload opens, so it may not
    start with '-' unless those fields are all in `option_fields`."""
    try:
        parts = scan(script)
    except ValueError as exc:
        raise InputError(where, str(exc), "fix the job type in herder.toml") from exc
    out: list[str] = []
    values: dict[str, str] = {}
    runs: dict[int, list[str]] = {}  # the placeholders that open each word
    tails: dict[int, str] = {}
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        name = part.name
        if part.run >= 0:
            runs.setdefault(part.run, []).append(name)
            tails.setdefault(part.run, part.tail)
        reference = f"${{{variable(name)}}}"
        out.append(f'"{reference}"' if part.context in ("word", "program") else reference)
        if name in keep:
            continue
        if name not in context:
            raise InputError(
                f"payload.{name}", f"{where} needs payload field {name!r}",
                f"pass -p {name}=... or --payload '{{\"{name}\": ...}}'",
            )
        values[variable(name)] = text(context[name])
    for first, names in runs.items():
        if not set(names) & set(keep):
            leading_dash_refusal(names, "".join(values[variable(name)] for name in names)
                                 + tails[first], where, option_fields)
    return "".join(out), values
