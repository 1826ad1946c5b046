// The core calls of the unmodified `e2b` and `@e2b/code-interpreter` npm packages against sandkasten serve, as
// node:test tests (run by crates/cli/tests/e2b_sdk.rs with NODE_PATH=target/e2b-node/node_modules and E2B_API_URL /
// E2B_SANDBOX_URL / E2B_API_KEY set): create, commands with output streamed while they run, background commands and
// their kill, files write/read/list, runCode (Python and JavaScript), a PTY (create, input, output, resize, kill) and
// kill, each checked on the server's side through the SDK too (commands.list, isRunning, Sandbox.list, getInfo), as the
// Python suite does. Every sandbox id is appended to E2B_SUITE_IDS_FILE, so the Rust test checks the host after it.
const assert = require('node:assert/strict')
const fs = require('node:fs')
const { after, before, test } = require('node:test')
const { CommandExitError, NotFoundError, Sandbox, SandboxNotFoundError } = require('e2b')
const CodeInterpreter = require('@e2b/code-interpreter')

const RUN = `e2b-node-core-${process.pid}`

/** `cls.create(opts)` tagged with this run's metadata, its id recorded for the host-side leak check. */
async function created(cls, opts = {}) {
  const sandbox = await cls.create({ ...opts, metadata: { suite: RUN } })
  if (process.env.E2B_SUITE_IDS_FILE) fs.appendFileSync(process.env.E2B_SUITE_IDS_FILE, `${sandbox.sandboxId}\n`)
  return sandbox
}

/** Polls `predicate` until true; fails naming `what` after `limitMs` (a bound, not a measurement). */
async function waitUntil(predicate, what, limitMs = 15000) {
  const deadline = Date.now() + limitMs
  while (!(await predicate())) {
    assert.ok(Date.now() < deadline, `timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

async function listedPids(sandbox) {
  return new Set((await sandbox.commands.list()).map((process) => process.pid))
}

let sandbox
before(async () => {
  sandbox = await created(Sandbox)
})
after(async () => {
  if (sandbox) await sandbox.kill()
})

test('commands.run streams stdout and stderr to the callbacks while the command runs', async () => {
  const chunks = []
  const stderr = []
  const result = await sandbox.commands.run('echo first; sleep 1.5; echo second; echo done >&2', {
    onStdout: (data) => chunks.push({ data, at: Date.now() }),
    onStderr: (data) => stderr.push(data),
  })
  const ended = Date.now()
  assert.equal(result.exitCode, 0)
  assert.equal(result.stdout, 'first\nsecond\n')
  assert.equal(chunks.map((chunk) => chunk.data).join(''), result.stdout)
  assert.equal(stderr.join(''), 'done\n')
  // "first" reached the callback while the command still slept, not at its end.
  assert.ok(chunks[0].data.startsWith('first'), `first chunk: ${JSON.stringify(chunks[0].data)}`)
  assert.ok(ended - chunks[0].at >= 1000, `first chunk came ${ended - chunks[0].at} ms before the end`)
})

test('commands.run passes envs, cwd and user, and a non-zero exit is CommandExitError', async () => {
  const result = await sandbox.commands.run('echo "$GREETING in $(pwd) as $(whoami)"', {
    envs: { GREETING: 'hello' },
    cwd: '/tmp',
  })
  assert.equal(result.stdout, 'hello in /tmp as user\n')
  assert.equal((await sandbox.commands.run('id -u', { user: 'root' })).stdout, '0\n')
  await assert.rejects(sandbox.commands.run('echo partial; exit 3'), (error) => {
    assert.ok(error instanceof CommandExitError, `expected CommandExitError, got ${error}`)
    assert.equal(error.exitCode, 3)
    assert.equal(error.stdout, 'partial\n')
    return true
  })
})

test('a background command is listed, gets stdin, and is gone once killed', async () => {
  const output = []
  const handle = await sandbox.commands.run('read line; echo "got $line"; sleep 60', {
    background: true,
    stdin: true,
    onStdout: (data) => output.push(data),
  })
  assert.ok((await listedPids(sandbox)).has(handle.pid), 'the background command is listed')
  await sandbox.commands.sendStdin(handle.pid, 'typed\n')
  await waitUntil(() => output.join('').includes('got typed'), 'the echo of the stdin line')
  assert.equal(await sandbox.commands.kill(handle.pid), true)
  await assert.rejects(handle.wait())
  await waitUntil(async () => !(await listedPids(sandbox)).has(handle.pid), 'the killed command to leave the list')
  assert.equal(await sandbox.commands.kill(handle.pid), false)
})

test('files: write text and bytes, read them back, list, exists, remove, and NotFoundError', async () => {
  const dir = '/home/user/node-files'
  await sandbox.files.write(`${dir}/notes.txt`, 'written by node')
  const bytes = Uint8Array.from([0, 1, 2, 253, 254, 255])
  await sandbox.files.write(`${dir}/sub/blob.bin`, bytes.buffer)
  assert.equal(await sandbox.files.read(`${dir}/notes.txt`), 'written by node')
  assert.deepEqual(new Uint8Array(await sandbox.files.read(`${dir}/sub/blob.bin`, { format: 'bytes' })), bytes)
  const entries = (await sandbox.files.list(dir)).map((entry) => `${entry.name}:${entry.type}`)
  assert.deepEqual(entries.sort(), ['notes.txt:file', 'sub:dir'])
  // What the SDK wrote is what a command in the sandbox sees.
  assert.equal((await sandbox.commands.run(`cat ${dir}/notes.txt; echo; stat -c %U ${dir}/notes.txt`)).stdout, 'written by node\nuser\n')
  assert.equal(await sandbox.files.exists(`${dir}/notes.txt`), true)
  await sandbox.files.remove(`${dir}/notes.txt`)
  assert.equal(await sandbox.files.exists(`${dir}/notes.txt`), false)
  await assert.rejects(sandbox.files.read(`${dir}/notes.txt`), NotFoundError)
})

test('pty: create, type into it, read its output, resize, reattach, and kill', async () => {
  const output = []
  const decoder = new TextDecoder()
  const seen = () => output.join('')
  const terminal = await sandbox.pty.create({
    cols: 80,
    rows: 24,
    cwd: '/tmp',
    envs: { GREETING: 'hi' },
    timeoutMs: 60000,
    onData: (data) => output.push(decoder.decode(data)),
  })
  const type = (text) => sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode(text))
  try {
    await type('echo $GREETING-$((20 + 22)) in $(pwd) as $(whoami); tty\n')
    await waitUntil(() => seen().includes('hi-42 in /tmp as user'), 'the pty echo')
    // `tty`'s line may come in a later chunk than the echo's.
    await waitUntil(() => /\/dev\/pts\/\d+/.test(seen()), "tty's /dev/pts/N line")
    await sandbox.pty.resize(terminal.pid, { cols: 132, rows: 40 })
    await type('stty size\n')
    await waitUntil(() => seen().includes('40 132'), 'the new terminal size')
    // A second client re-attaches and gets what the terminal printed so far, then what follows.
    const replay = []
    const attached = await sandbox.pty.connect(terminal.pid, { onData: (data) => replay.push(decoder.decode(data)) })
    await waitUntil(() => replay.join('').includes('hi-42 in /tmp as user'), 'the output so far, replayed')
    await type('echo after-$((40 + 2))\n')
    await waitUntil(() => replay.join('').includes('after-42'), 'what follows the connect')
    await attached.disconnect()
    assert.ok((await listedPids(sandbox)).has(terminal.pid), 'the pty is listed as a process')
    assert.equal(await sandbox.pty.kill(terminal.pid), true)
    await terminal.wait().catch(() => {}) // a killed terminal's wait may reject; either way it ends
    await waitUntil(async () => !(await listedPids(sandbox)).has(terminal.pid), 'the killed pty to leave the list')
    assert.equal(await sandbox.pty.kill(terminal.pid), false)
  } finally {
    await sandbox.pty.kill(terminal.pid).catch(() => {})
  }
})

test('runCode keeps Python state, streams logs, reports errors, and runs JavaScript', async () => {
  const interpreter = await created(CodeInterpreter.Sandbox)
  try {
    assert.equal((await interpreter.runCode('x = 41')).error, undefined)
    const stdout = []
    const execution = await interpreter.runCode('print("from python")\nx + 1', {
      onStdout: (message) => stdout.push(message.line),
    })
    assert.equal(execution.text, '42')
    assert.deepEqual(execution.logs.stdout, ['from python\n'])
    assert.deepEqual(stdout, ['from python\n'])
    const failed = await interpreter.runCode('1 / 0')
    assert.equal(failed.error.name, 'ZeroDivisionError')
    assert.equal((await interpreter.runCode('const a = 2; a * 21', { language: 'js' })).text, '42')
    assert.equal((await interpreter.runCode('"text"', { language: 'js' })).text, 'text')
    // The interpreter runs inside the sandbox: what it writes, a command there reads.
    await interpreter.runCode('open("/home/user/from-cell.txt", "w").write("cell")')
    assert.equal((await interpreter.commands.run('cat /home/user/from-cell.txt')).stdout, 'cell')
  } finally {
    assert.equal(await interpreter.kill(), true)
  }
})

test('kill ends the sandbox: not running, not listed, not found, and a second kill is false', async () => {
  const doomed = await created(Sandbox)
  const id = doomed.sandboxId
  const listed = async () => {
    const paginator = Sandbox.list({ query: { metadata: { suite: RUN } } })
    const ids = []
    while (paginator.hasNext) ids.push(...(await paginator.nextItems()).map((info) => info.sandboxId))
    return ids
  }
  assert.ok((await listed()).includes(id), 'the new sandbox is listed')
  assert.equal(await doomed.kill(), true)
  assert.equal(await doomed.isRunning(), false)
  assert.ok(!(await listed()).includes(id), 'the killed sandbox is not listed')
  await assert.rejects(Sandbox.getInfo(id), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(id), false)
  await assert.rejects(doomed.commands.run('echo never'))
})
