"""Code cells through the sync Sandbox: state across cells, the last expression as text, a PNG figure, a cell's
exception, streamed output and results, and contexts (create, list, restart, delete, JavaScript)."""

from __future__ import annotations

from typing import List

from sandkasten import CellResult, Sandbox

import support


def test_state_persists_and_the_last_value_comes_back(sbx: Sandbox) -> None:
    sbx.run_code("x = 41")
    cell = sbx.run_code("print('side'); x + 1", language="python")
    assert cell.text == "42" and cell.stdout == "side\n" and cell.error is None


def test_a_figure_comes_back_as_png() -> None:
    with support.create(limits=support.HEAVY_CODE_LIMITS) as sandbox:
        cell = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert cell.error is None, cell.error
    assert cell.png and cell.png[0].startswith(b"\x89PNG\r\n\x1a\n")


def test_an_exception_is_the_cells_error(sbx: Sandbox) -> None:
    cell = sbx.run_code("1 / 0")
    assert cell.error is not None and cell.error.name == "ZeroDivisionError" and cell.error.traceback


def test_streamed_cell_output_and_results(sbx: Sandbox) -> None:
    out: List[str] = []
    results: List[CellResult] = []
    cell = sbx.run_code("for i in range(3): print(i)\n'end'", on_stdout=out.append, on_result=results.append)
    assert "".join(out) == "0\n1\n2\n" and cell.stdout == "0\n1\n2\n"
    assert [result.text for result in results] == ["'end'"] and cell.text == "'end'"


def test_contexts_are_separate_and_restartable(sbx: Sandbox) -> None:
    context = sbx.contexts.create("python")
    assert context.id.startswith("ctx-") and not context.default
    sbx.run_code("y = 'mine'", context=context)
    assert sbx.run_code("y", context=context.id).text == "'mine'"
    assert sbx.run_code("'y' in globals()").text == "False"
    assert context.id in {listed.id for listed in sbx.contexts.list()}
    restarted = sbx.contexts.restart(context)
    assert restarted.execution_count == 0
    assert sbx.run_code("'y' in globals()", context=context).text == "False"
    sbx.contexts.delete(context)
    assert context.id not in {listed.id for listed in sbx.contexts.list()}


def test_javascript_cells(sbx: Sandbox) -> None:
    sbx.run_code("let n = 20", language="javascript")
    assert sbx.run_code("n * 2 + 2", language="javascript").text == "42"
