// The Node.js zygote of a warm pool member (run as `node -e <this> [module ...]` in the background): requires the
// modules given as arguments, then waits for one program path on stdin (until EOF) and runs that file as the main
// module of this very process, exactly as `node PATH` does (CommonJS or ES module, same argv, same uncaught-error
// report and exit code). Node cannot fork, and a child_process.fork() child would start cold; instead the waiting
// process itself is the fresh process of the run: it has run no caller's code before, it serves exactly one run, and
// its sandbox is destroyed afterwards, so nothing is shared between executions or callers.
'use strict';
const Module = require('module');

for (const name of process.argv.slice(1)) {
  try {
    require(name);
  } catch (_) {
    // A module that cannot be loaded is simply not preloaded.
  }
}

const chunks = [];
process.stdin.on('data', (chunk) => chunks.push(chunk));
process.stdin.on('end', () => {
  const main = Buffer.concat(chunks).toString('utf8').trim();
  process.stdin.removeAllListeners();
  // What `node -e` adds to the global scope, and the script itself: the program sees what `node PATH` shows.
  for (const name of ['require', 'module', 'exports', '__filename', '__dirname']) {
    delete globalThis[name];
  }
  delete process._eval;
  process.argv = [process.argv[0], main];
  // From a fresh tick, so that no frame of this file is on the program's stack.
  setImmediate(Module.runMain, main);
});
