"""`e2b_code_interpreter.Sandbox.run_code` and code contexts (sync client): Python state across calls, results as text,
PNG (matplotlib) and HTML (pandas), logs streamed to callbacks while the cell runs, errors with traceback,
execution_count, envs, timeouts, JavaScript, and create/list/restart/remove of contexts."""

import base64
import os
import threading
import time

import pytest

import support
from e2b_code_interpreter import NotFoundException, Sandbox, TimeoutException


@pytest.fixture(scope="module")
def ci():
    sandbox = support.create(Sandbox)
    yield sandbox
    sandbox.kill()


def test_python_state_persists_across_calls(ci):
    first = ci.run_code("counter = 41\ndef bump():\n    global counter\n    counter += 1\n    return counter")
    assert first.error is None
    second = ci.run_code("bump()")
    assert second.text == "42"
    assert second.results[0].is_main_result
    assert ci.run_code("counter").text == "42"


def test_execution_count_increases(ci):
    one = ci.run_code("1")
    two = ci.run_code("2")
    assert one.execution_count is not None and two.execution_count == one.execution_count + 1


def test_logs_collect_stdout_and_stderr(ci):
    execution = ci.run_code("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nNone")
    assert "".join(execution.logs.stdout) == "to stdout\n"
    assert "".join(execution.logs.stderr) == "to stderr\n"
    assert execution.results == []


def test_stdout_reaches_the_callback_while_the_cell_runs(ci):
    # The cell waits for a file only the callback writes: output delivered at the end would make it time out.
    gate = support.unique("/tmp/ci-gate")
    seen = []

    def on_stdout(message):
        seen.append(message.line)
        if "waiting" in message.line:
            ci.files.write(gate, "")

    code = (
        "import os, time\nprint('waiting', flush=True)\n"
        f"while not os.path.exists({gate!r}):\n    time.sleep(0.02)\nprint('released')"
    )
    execution = ci.run_code(code, on_stdout=on_stdout, timeout=30)
    assert execution.error is None
    assert "".join(seen) == "waiting\nreleased\n"


def test_result_and_error_callbacks(ci):
    results, errors = [], []
    ci.run_code("'value'", on_result=results.append, on_error=errors.append)
    # E2B's server takes the quotes off a string's text (Python's repr and JavaScript's inspect alike).
    assert [r.text for r in results] == ["value"]
    ci.run_code("raise KeyError('k')", on_result=results.append, on_error=errors.append)
    assert [e.name for e in errors] == ["KeyError"]


def test_error_has_name_value_and_traceback(ci):
    execution = ci.run_code("def inner():\n    return 1 / 0\ninner()")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert "division by zero" in execution.error.value
    assert "inner" in execution.error.traceback and "ZeroDivisionError" in execution.error.traceback
    # The context survives an error.
    assert ci.run_code("'alive'").text == "alive"


def test_matplotlib_plot_gives_a_png(ci):
    execution = ci.run_code(
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [3, 1, 2])\nplt.title('e2b suite')\nplt.show()"
    )
    assert execution.error is None, execution.error
    pngs = [r.png for r in execution.results if r.png]
    assert pngs, execution.results
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
    assert "png" in list(next(r for r in execution.results if r.png).formats())


def test_pandas_dataframe_gives_html(ci):
    execution = ci.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert execution.error is None, execution.error
    main = execution.results[0]
    assert main.is_main_result
    assert "<table" in main.html
    assert "0  1  3" in main.text


def test_display_html_object(ci):
    execution = ci.run_code("class Page:\n    def _repr_html_(self):\n        return '<b>bold</b>'\nPage()")
    assert execution.results[0].html == "<b>bold</b>"


def test_envs_apply_to_one_run_and_are_put_back(ci):
    code = "import os, subprocess\nprint(subprocess.run(['sh', '-c', 'echo $RUN_VAR'], capture_output=True, text=True).stdout, end='')\nos.environ.get('RUN_VAR')"
    execution = ci.run_code(code, envs={"RUN_VAR": "set"})
    assert execution.error is None, execution.error
    assert execution.text == "set"
    assert execution.logs.stdout == ["set\n"], "a subprocess of the cell sees it too"
    assert ci.run_code("import os; os.environ.get('RUN_VAR', 'default')").text == "default", "removed after the cell"
    # A variable the sandbox already has is overwritten for the one cell, then has its own value again.
    assert ci.run_code("import os; os.environ['HOME']", envs={"HOME": "/tmp/elsewhere"}).text == "/tmp/elsewhere"
    assert ci.run_code("import os; os.environ['HOME']").text == "/home/user"
    # Also when the cell raises.
    failed = ci.run_code("raise ValueError('x')", envs={"RUN_VAR": "set"})
    assert failed.error is not None and failed.error.name == "ValueError"
    assert ci.run_code("import os; 'RUN_VAR' in os.environ").text == "False"


def test_envs_apply_to_one_javascript_run(ci):
    assert ci.run_code("process.env.JS_VAR", envs={"JS_VAR": "bar"}, language="javascript").text == "bar"
    assert ci.run_code("process.env.JS_VAR || 'default'", language="javascript").text == "default"


def test_envs_with_a_bad_name_are_refused(ci):
    from e2b import SandboxException

    with pytest.raises(SandboxException) as raised:
        ci.run_code("1", envs={"NOT=A NAME": "x"})
    assert "400" in str(raised.value) and "environment variable name" in str(raised.value)


def test_execution_timeout_raises(ci):
    # In a context of its own: the abandoned cell must not hold up the other tests' default context.
    context = ci.create_code_context()
    with pytest.raises(TimeoutException):
        ci.run_code("import time\ntime.sleep(30)", timeout=2, context=context)
    ci.remove_code_context(context)


def test_a_cell_whose_client_timed_out_is_interrupted_so_the_next_one_runs(ci):
    # In the default context, as E2B's own test does: without the interrupt the next cell would wait behind the
    # abandoned one (the sandbox lets a cell run an hour).
    with pytest.raises(TimeoutException):
        ci.run_code("import time\nwhile True:\n    time.sleep(0.05)", timeout=2)
    started = time.monotonic()
    assert ci.run_code("1 + 1", timeout=20).text == "2"
    assert time.monotonic() - started < 15


def test_a_timed_out_cell_that_ignores_interrupts_is_stopped_too(ci):
    context = ci.create_code_context()
    try:
        ci.run_code("stays = 1", context=context)
        with pytest.raises(TimeoutException):
            ci.run_code("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(300)",
                        timeout=2, context=context)
        after = ci.run_code("'stays' in globals()", timeout=30, context=context)
        assert after.error is None and after.text == "False", "the kernel had to be killed and started again"
    finally:
        ci.remove_code_context(context)


def test_an_interpreter_killed_by_its_cell_comes_back_fresh(ci):
    context = ci.create_code_context()
    try:
        ci.run_code("kept = 1", context=context)
        killed = ci.run_code("import os\nos.kill(os.getpid(), 9)", context=context)
        assert killed.error is not None and killed.error.name == "ContextRestarting", killed.error
        after = ci.run_code("'kept' in globals()", context=context)
        assert after.error is None and after.text == "False"
        assert ci.run_code("1 + 1", context=context).text == "2"
    finally:
        ci.remove_code_context(context)


def test_an_interpreter_killed_between_cells_comes_back(ci):
    context = ci.create_code_context(language="javascript")
    try:
        pid = ci.run_code("process.pid", context=context).text
        # The cell answers, then its interpreter dies (commands run in a PID namespace of their own: no kill from
        # there).
        ci.run_code("setTimeout(() => process.kill(process.pid, 'SIGKILL'), 100); 'bye'", context=context)
        time.sleep(1)
        after = ci.run_code("1 + 1", context=context)
        assert after.error is None and after.text == "2"
        assert ci.run_code("process.pid", context=context).text != pid
    finally:
        ci.remove_code_context(context)


def test_killing_the_sandbox_during_a_cell_raises_the_killed_error():
    sandbox = support.create(Sandbox)
    timer = threading.Timer(2.0, sandbox.kill)
    timer.start()
    try:
        # The code interpreter SDK's words (envd's "killed or reached its end of life" is the commands' error).
        with pytest.raises(TimeoutException, match="sandbox was killed while the request was in progress"):
            sandbox.run_code("import time; time.sleep(300)", timeout=300)
    finally:
        timer.cancel()


def test_javascript_keeps_state_and_returns_values(ci):
    first = ci.run_code("const base = 40; function add(x) { return base + x }", language="javascript")
    assert first.error is None, first.error
    assert ci.run_code("add(2)", language="javascript").text == "42"
    logged = ci.run_code("console.log('from node')", language="js")
    assert "".join(logged.logs.stdout) == "from node\n"
    failed = ci.run_code("throw new TypeError('bad js')", language="javascript")
    assert failed.error is not None and failed.error.name == "TypeError"
    assert "bad js" in failed.error.value


def test_created_context_is_separate_listed_restarted_and_removed(ci):
    context = ci.create_code_context(language="python")
    assert context.id and context.language == "python" and context.cwd == "/home/user"
    assert ci.run_code("import os; os.getcwd()", context=context).text == "/home/user"
    ci.run_code("only_here = 1", context=context)
    assert ci.run_code("'only_here' in globals()", context=context).text == "True"
    assert ci.run_code("'only_here' in globals()").text == "False"
    assert context.id in [c.id for c in ci.list_code_contexts()]

    ci.restart_code_context(context)
    assert ci.run_code("'only_here' in globals()", context=context).text == "False"

    ci.remove_code_context(context.id)
    assert context.id not in [c.id for c in ci.list_code_contexts()]
    with pytest.raises(NotFoundException):
        ci.run_code("1", context=context)


def test_created_context_uses_its_cwd(ci):
    ci.files.make_dir("/home/user/ctx-dir")
    context = ci.create_code_context(cwd="/home/user/ctx-dir")
    js = ci.create_code_context(cwd="/tmp", language="javascript")
    try:
        assert context.cwd == "/home/user/ctx-dir"
        assert ci.run_code("import os; os.getcwd()", context=context).text == "/home/user/ctx-dir"
        assert ci.run_code("open('here.txt', 'w').write('x')", context=context).error is None
        assert ci.files.read("/home/user/ctx-dir/here.txt") == "x"
        assert ci.run_code("process.cwd()", context=js).text == "/tmp"
        listed = {c.id: c.cwd for c in ci.list_code_contexts()}
        assert listed[context.id] == "/home/user/ctx-dir" and listed[js.id] == "/tmp"
        # A restart keeps the directory.
        ci.restart_code_context(context)
        assert ci.run_code("import os; os.getcwd()", context=context).text == "/home/user/ctx-dir"
        # The default context stays in the home.
        assert ci.run_code("import os; os.getcwd()").text == "/home/user"
    finally:
        ci.remove_code_context(context)
        ci.remove_code_context(js)


def test_a_context_in_a_missing_directory_is_refused(ci):
    with pytest.raises(NotFoundException) as raised:
        ci.create_code_context(cwd="/home/user/no-such-dir")
    assert "/home/user/no-such-dir does not exist" in str(raised.value)
    ci.files.write("/home/user/a-file", "")
    from e2b import SandboxException

    with pytest.raises(SandboxException) as raised:
        ci.create_code_context(cwd="/home/user/a-file")
    assert "is not a directory" in str(raised.value)


def test_javascript_context(ci):
    context = ci.create_code_context(language="javascript")
    assert context.language in ("javascript", "js")
    ci.run_code("let n = 1", context=context)
    assert ci.run_code("n + 1", context=context).text == "2"
    ci.remove_code_context(context)


def test_javascript_values_are_rendered_as_e2b_renders_them(ci):
    assert ci.run_code("'Hello'", language="js").text == "Hello"
    assert ci.run_code("({ a: 1, b: 'x' })", language="js").text == "{ a: 1, b: 'x' }"
    awaited = ci.run_code("\n    await Promise.resolve('Hello World!')\n    ", language="js")
    assert awaited.error is None and awaited.text == "Hello World!"
    esm = "\n    import { readFileSync } from 'fs'\n    console.log(typeof readFileSync)\n    "
    for _ in range(2):  # a cell with imports can run again
        imported = ci.run_code(esm, language="js")
        assert imported.error is None, imported.error
        assert imported.logs.stdout == ["function\n"]
    namespaced = ci.run_code("import * as path from 'path'\npath.basename('/a/b.txt')", language="js")
    assert namespaced.text == "b.txt"
    missing = ci.run_code("import { x } from 'no-such-module'", language="js")
    assert missing.error is not None and "Cannot find module 'no-such-module'" in missing.error.value


# The sandbox's /usr is this host's: R installed here has its kernel there (test_r_keeps_state_...), else the 400 names
# what to install. A name E2B does not know is a 400 either way.
_WITHOUT_A_KERNEL = [("cobol", "is not supported")] + (
    [] if os.path.exists("/usr/bin/R") else [("r", "apt-get install r-base-core")]
)


@pytest.mark.parametrize("language, install", _WITHOUT_A_KERNEL)
def test_languages_without_a_kernel_are_a_400_naming_what_is_missing(ci, language, install):
    from e2b import SandboxException

    with pytest.raises(SandboxException) as raised:
        ci.run_code("print(1)", language=language)
    message = str(raised.value)
    assert message.startswith("400"), message
    assert install in message, message


@pytest.fixture
def java_ci():
    """A sandbox of its own: a JVM next to the module's Python, JavaScript and TypeScript kernels would not fit in the
    default 256 MiB on gVisor (docs/e2b-compat.md)."""
    import os

    if not os.path.exists("/usr/bin/jshell"):
        pytest.skip("no JDK on this host (/usr/bin/jshell; scripts/setup.sh installs openjdk-17-jdk-headless)")
    sandbox = support.create(Sandbox)
    yield sandbox
    sandbox.kill()


def test_java_keeps_declarations_and_returns_values_and_errors(java_ci):
    ci = java_ci
    first = ci.run_code("int base = 40;\nint add(int x) { return base + x; }", language="java")
    assert first.error is None, first.error
    assert ci.run_code("add(2)", language="java").text == "42"
    assert ci.run_code('"Hello " + "World"', language="java").text == "Hello World"
    printed = ci.run_code('System.out.println("from java");', language="java")
    assert printed.logs.stdout == ["from java\n"]
    failed = ci.run_code('throw new IllegalStateException("bad java");', language="java")
    assert failed.error is not None and failed.error.name == "java.lang.IllegalStateException", failed.error
    assert failed.error.value == "bad java"
    broken = ci.run_code("int y = ;", language="java")
    assert broken.error is not None and broken.error.name == "CompilationException", broken.error
    assert ci.run_code('System.getenv("JAVA_VAR")', envs={"JAVA_VAR": "set"}, language="java").text == "set"
    assert ci.run_code('System.getenv("JAVA_VAR") == null', language="java").text == "true"
    context = ci.create_code_context(language="java")
    try:
        assert context.language == "java"
        unknown = ci.run_code("base", context=context)
        assert unknown.error is not None and unknown.error.name == "CompilationException", "a context of its own"
    finally:
        ci.remove_code_context(context)


@pytest.fixture
def r_ci():
    """A sandbox of its own: an R session next to the module's Python, JavaScript and TypeScript kernels is more than
    the default 256 MiB on gVisor wants to hold."""
    if not os.path.exists("/usr/bin/R"):
        pytest.skip("no R on this host (/usr/bin/R; scripts/setup.sh installs r-base-core)")
    sandbox = support.create(Sandbox)
    yield sandbox
    sandbox.kill()


def test_r_keeps_state_and_returns_printed_values_errors_and_envs(r_ci):
    ci = r_ci
    first = ci.run_code("base <- 40\nadd <- function(n) base + n", language="r")
    assert first.error is None, first.error
    assert first.text is None, "assignments are invisible"
    assert ci.run_code("add(2)", language="r").text == "[1] 42"
    printed = ci.run_code("cat('from r\\n')\nmessage('to stderr')\n1:3\npaste('a', 'b')", language="r")
    assert "".join(printed.logs.stdout) == "from r\n[1] 1 2 3\n", printed.logs
    assert "".join(printed.logs.stderr) == "to stderr\n", printed.logs
    assert printed.text == '[1] "a b"'
    plotted = ci.run_code("plot(1:10)", language="r")
    assert plotted.error is None and plotted.results and plotted.results[0].png, plotted
    failed = ci.run_code("stop('bad r')", language="r")
    assert failed.error is not None and failed.error.name == "Error", failed.error
    assert failed.error.value == "bad r"
    assert ci.run_code("Sys.getenv('R_VAR')", envs={"R_VAR": "set"}, language="r").text == '[1] "set"'
    assert ci.run_code("Sys.getenv('R_VAR', unset = 'gone')", language="r").text == '[1] "gone"'
    context = ci.create_code_context(language="r")
    try:
        assert context.language == "r"
        assert ci.run_code("exists('base')", context=context).text == "[1] FALSE", "a context of its own"
    finally:
        ci.remove_code_context(context)


def test_typescript_runs_with_its_types_stripped_and_keeps_state(ci):
    first = ci.run_code("const base: number = 40\nfunction add(x: number): number { return base + x }", language="ts")
    assert first.error is None, first.error
    assert ci.run_code("add(2)", language="typescript").text == "42"
    interface = ci.run_code("interface Point { x: number }\nconst p: Point = { x: 3 }\np.x * 2", language="ts")
    assert interface.text == "6", interface
    assert ci.run_code("import { basename } from 'path'\nbasename('/a/b.ts') as string", language="ts").text == "b.ts"
    assert ci.run_code("await Promise.resolve<number>(7)", language="ts").text == "7"
    printed = ci.run_code("enum Color { Red, Green }\nconsole.log(Color[1])", language="ts")
    assert printed.logs.stdout == ["Green\n"]
    broken = ci.run_code("let y: = 3", language="ts")
    assert broken.error is not None and broken.error.name == "SyntaxError", broken.error
    assert "Type expected" in broken.error.value
    context = ci.create_code_context(language="typescript")
    try:
        assert context.language in ("typescript", "ts")
        assert ci.run_code("typeof base", context=context).text == "undefined", "a context of its own"
    finally:
        ci.remove_code_context(context)


def test_language_and_context_together_are_refused(ci):
    from e2b import InvalidArgumentException

    context = ci.create_code_context()
    try:
        with pytest.raises(InvalidArgumentException):
            ci.run_code("1", language="python", context=context)
    finally:
        ci.remove_code_context(context)


def test_code_interpreter_sandbox_also_runs_commands_and_files(ci):
    ci.files.write("/home/user/from-files.py", "print('via commands')")
    assert ci.commands.run("python3 /home/user/from-files.py").stdout == "via commands\n"
    assert ci.run_code("open('/home/user/from-files.py').read()").text == "print('via commands')"


def test_create_envs_reach_run_code_and_a_killed_sandbox_fails():
    sandbox = support.create(Sandbox, envs={"SANDBOX_VAR": "from create"})
    assert sandbox.run_code("import os; os.environ.get('SANDBOX_VAR')").text == "from create"
    sandbox.kill()
    with pytest.raises(TimeoutException):
        sandbox.run_code("1")


# Output arrives in pieces as the shell writes it: the tests join the pieces.
def test_bash_cells_share_one_shell(ci):
    context = ci.create_code_context(language="bash")
    try:
        assert context.language == "bash"
        assert "".join(ci.run_code("pwd", context=context).logs.stdout) == "/home/user\n"
        assert ci.run_code("cd /tmp && X=41 && f() { echo in-f; }", context=context).error is None
        assert "".join(ci.run_code("echo $((X + 1)) $(pwd); f", context=context).logs.stdout) == "42 /tmp\nin-f\n"
        assert "".join(ci.run_code("echo $FOO", envs={"FOO": "bar"}, context=context).logs.stdout) == "bar\n"
        assert "".join(ci.run_code("echo ${FOO:-default}", context=context).logs.stdout) == "default\n"
        errors = ci.run_code("echo to-stderr >&2; false", context=context)
        assert "".join(errors.logs.stderr) == "to-stderr\n"
        assert errors.error is not None and errors.error.value == "1", "a non-zero status is the cell's error"
        assert "".join(ci.run_code("cat; echo after", context=context).logs.stdout) == "after\n", "stdin is not the cells"
        with pytest.raises(TimeoutException):
            ci.run_code("sleep 300; echo never", timeout=2, context=context)
        after = ci.run_code("echo $X", timeout=20, context=context)
        assert "".join(after.logs.stdout) == "41\n", "interrupted, the shell and its variables live on"
    finally:
        ci.remove_code_context(context)
    by_language = ci.run_code("echo via-language", language="bash")
    assert "".join(by_language.logs.stdout) == "via-language\n" and by_language.results == []


def test_display_outputs_come_in_order_before_the_main_result(ci):
    code = (
        "from IPython.display import display, HTML, Markdown, JSON\n"
        "display(HTML('<b>first</b>'))\n"
        "print('between')\n"
        "display(Markdown('**second**'), JSON({'third': [1, 2]}))\n"
        "display('fourth')\n"
        "'main'"
    )
    execution = ci.run_code(code)
    assert execution.error is None, execution.error
    results = execution.results
    assert [r.is_main_result for r in results] == [False, False, False, False, True]
    assert results[0].html == "<b>first</b>"
    assert results[1].markdown == "**second**" and "markdown" in list(results[1].formats())
    assert results[2].json == {"third": [1, 2]}
    assert results[3].text == "fourth"
    assert execution.text == "main"
    assert execution.logs.stdout == ["between\n"]


def test_displayed_matplotlib_figures_are_pngs_shown_once(ci):
    execution = ci.run_code(
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3])\n"
        "display(fig)\ndisplay('after the figure')\nNone"
    )
    assert execution.error is None, execution.error
    assert [bool(r.png) for r in execution.results] == [True, False], execution.results
    assert base64.b64decode(execution.results[0].png).startswith(b"\x89PNG")
    assert execution.results[1].text == "after the figure"


def test_display_output_is_kept_when_the_cell_raises(ci):
    execution = ci.run_code("display({'shown': True})\nraise RuntimeError('after display')")
    assert execution.error is not None and execution.error.name == "RuntimeError"
    assert [r.text for r in execution.results] == ["{'shown': True}"]


CHART_CELLS = {
    "line": (
        "import matplotlib.pyplot as plt\nimport numpy as np\nx = np.linspace(0, 10, 5)\n"
        "plt.plot(x, np.sin(x), label='sin(x)')\nplt.plot(x, np.cos(x), label='cos(x)')\n"
        "plt.title('Waves'); plt.xlabel('Time (s)'); plt.ylabel('Amplitude')\nplt.show()"
    ),
    "bar": (
        "import matplotlib.pyplot as plt\nplt.figure()\n"
        "plt.bar(['Author A', 'Author B', 'Author C'], [100, 200, 300], label='Books Sold')\n"
        "plt.title('Book Sales'); plt.xlabel('Authors'); plt.ylabel('Sold')\nplt.show()"
    ),
    "scatter": "import matplotlib.pyplot as plt\nplt.figure()\nplt.scatter([1, 2, 3], [4, 5, 6], label='points')\nplt.show()",
    "pie": "import matplotlib.pyplot as plt\nplt.figure()\nplt.pie([1, 3], labels=['a', 'b'])\nplt.title('Shares')\nplt.show()",
    "box_and_whisker": (
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
        "data = {'Class A': [85, 90, 78, 92, 88], 'Class B': [95, 89, 76, 91, 84, 87], 'Class C': [75, 82, 88, 79, 86]}\n"
        "ax.boxplot(data.values(), labels=data.keys(), patch_artist=True)\nax.set_title('Exam Scores')\n"
        "ax.set_xlabel('Class'); ax.set_ylabel('Score')\nplt.show()"
    ),
}


def test_matplotlib_charts_come_with_their_data(ci):
    from e2b_code_interpreter.charts import (
        BarChart, BoxAndWhiskerChart, ChartType, LineChart, PieChart, ScatterChart, SuperChart,
    )

    charts = {}
    for kind, code in CHART_CELLS.items():
        execution = ci.run_code(code)
        assert execution.error is None, execution.error
        assert execution.results and execution.results[0].png, kind
        charts[kind] = execution.results[0].chart
    line = charts["line"]
    assert isinstance(line, LineChart) and line.type == ChartType.LINE and line.title == "Waves"
    assert (line.x_label, line.y_label) == ("Time (s)", "Amplitude")
    assert [e.label for e in line.elements] == ["sin(x)", "cos(x)"]
    assert line.elements[1].points[0] == (0.0, 1.0) and len(line.elements[0].points) == 5
    assert line.x_scale.value == "linear"
    bar = charts["bar"]
    assert isinstance(bar, BarChart) and bar.title == "Book Sales" and bar.x_label == "Authors"
    assert [(b.label, b.value, b.group) for b in bar.elements] == [
        ("Author A", 100, "Books Sold"), ("Author B", 200, "Books Sold"), ("Author C", 300, "Books Sold"),
    ]
    scatter = charts["scatter"]
    assert isinstance(scatter, ScatterChart) and scatter.elements[0].points == [(1, 4), (2, 5), (3, 6)]
    pie = charts["pie"]
    assert isinstance(pie, PieChart) and pie.title == "Shares"
    assert [(p.label, p.angle) for p in pie.elements] == [("a", 90), ("b", 270)]
    box = charts["box_and_whisker"]
    assert isinstance(box, BoxAndWhiskerChart) and (box.x_label, box.y_label) == ("Class", "Score")
    # The numbers E2B's own test expects for this plot.
    assert [b.label for b in box.elements] == ["Class A", "Class B", "Class C"]
    assert [b.outliers for b in box.elements] == [[], [76], []]
    assert [b.min for b in box.elements] == [78, 84, 75]
    assert [b.first_quartile for b in box.elements] == [85, 84.75, 79]
    assert [b.median for b in box.elements] == [88, 88, 82]
    assert [b.third_quartile for b in box.elements] == [90, 90.5, 86]
    assert [b.max for b in box.elements] == [92, 95, 88]

    both = ci.run_code(
        "import matplotlib.pyplot as plt\nfig, (a, b) = plt.subplots(1, 2)\nfig.suptitle('Both')\n"
        "a.plot([1, 2], [3, 4])\nb.bar(['x', 'y'], [1, 2])\nplt.show()"
    ).results[0].chart
    assert isinstance(both, SuperChart) and both.title == "Both"
    assert [type(c) for c in both.elements] == [LineChart, BarChart]
    assert ci.run_code("import matplotlib.pyplot as plt\nplt.figure()\nplt.show()").results[0].chart is None
