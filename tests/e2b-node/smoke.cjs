// Smoke test of the unmodified `e2b` npm package against sandkasten serve (run by crates/cli/tests/e2b_sdk.rs with
// NODE_PATH=target/e2b-node/node_modules and E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY set): create, commands.run
// (with streamed output and an exit-code error), files write/read/list, kill. Exits non-zero on the first failure.
const assert = require('node:assert/strict')
const { Sandbox, CommandExitError, NotFoundError } = require('e2b')

async function main() {
  const sandbox = await Sandbox.create({ metadata: { suite: 'e2b-node-smoke' } })
  console.log(`sandbox ${sandbox.sandboxId} created`)
  try {
    const streamed = []
    const result = await sandbox.commands.run('echo hello from node; whoami; pwd', {
      onStdout: (data) => streamed.push(data),
    })
    assert.equal(result.exitCode, 0)
    assert.equal(result.stdout, 'hello from node\nuser\n/home/user\n')
    assert.equal(streamed.join(''), result.stdout)

    await assert.rejects(sandbox.commands.run('echo bad >&2; exit 4'), (error) => {
      assert.ok(error instanceof CommandExitError, `expected CommandExitError, got ${error}`)
      assert.equal(error.exitCode, 4)
      assert.equal(error.stderr, 'bad\n')
      return true
    })

    await sandbox.files.write('/home/user/node/hello.txt', 'written by node')
    assert.equal(await sandbox.files.read('/home/user/node/hello.txt'), 'written by node')
    const names = (await sandbox.files.list('/home/user/node')).map((entry) => entry.name)
    assert.deepEqual(names, ['hello.txt'])
    await assert.rejects(sandbox.files.read('/home/user/node/missing.txt'), NotFoundError)
  } finally {
    assert.equal(await sandbox.kill(), true)
    console.log(`sandbox ${sandbox.sandboxId} killed`)
  }
  assert.equal(await sandbox.isRunning(), false)
}

main().then(
  () => console.log('e2b node smoke: ok'),
  (error) => {
    console.error('e2b node smoke failed:', error)
    process.exit(1)
  },
)
