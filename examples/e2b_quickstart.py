"""An E2B quickstart, written for E2B's cloud and run unchanged against sandkasten: only the environment differs.

    export E2B_API_URL=http://127.0.0.1:8080      # where `sandkasten serve` listens
    export E2B_SANDBOX_URL=http://127.0.0.1:8080  # the same server serves the in-sandbox services
    export E2B_API_KEY=e2b_...                    # a tenant key from sandkasten's config
    python examples/e2b_quickstart.py

Needs the `e2b-code-interpreter` package (scripts/setup-e2b.sh installs it into target/e2b-venv) and, for the plot,
matplotlib where the sandbox runs.
"""

import base64

from e2b_code_interpreter import Sandbox

sandbox = Sandbox.create(timeout=120)
print(f"sandbox {sandbox.sandbox_id} created")
try:
    # Commands, with output streamed as it is printed.
    result = sandbox.commands.run(
        "echo hello from $(whoami) in $(pwd); sleep 0.2; echo done >&2",
        on_stdout=lambda line: print("stdout:", line, end=""),
        on_stderr=lambda line: print("stderr:", line, end=""),
    )
    assert result.exit_code == 0

    # Files.
    sandbox.files.write("/home/user/data/numbers.csv", "x,y\n1,2\n2,4\n3,8\n")
    print("read back:", sandbox.files.read("/home/user/data/numbers.csv").splitlines())
    print("listing:", [entry.name for entry in sandbox.files.list("/home/user/data")])

    # Python state kept across run_code calls.
    loaded = sandbox.run_code("import csv\nrows = list(csv.DictReader(open('/home/user/data/numbers.csv')))")
    assert loaded.error is None, loaded.error
    total = sandbox.run_code("sum(int(row['y']) for row in rows)")
    print("sum of y:", total.text)
    assert total.text == "14"

    # A matplotlib plot comes back as a PNG.
    plot = sandbox.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([int(r['x']) for r in rows], [int(r['y']) for r in rows])\n"
        "plt.show()"
    )
    png = next(result.png for result in plot.results if result.png)
    with open("plot.png", "wb") as out:
        out.write(base64.b64decode(png))
    print("plot saved to plot.png")
finally:
    sandbox.kill()
    print(f"sandbox {sandbox.sandbox_id} killed")
