// sandkasten JavaScript kernel: one long-running node process per code context, code run in one `vm` context.
//
// Protocol (one JSON object per line):
//   stdin:  {"id": ..., "code": "...", "env": {"NAME": "value", ...}, "timeout_ms": N}
//   stdout: {"type": "ready", "language": "javascript"}
//           {"type": "stream", "id": ..., "name": "stdout"|"stderr", "text": "..."}
//           {"type": "reply", "id": ..., "execution_count": N, "results": [...], "error": ...}
// console.* and process.stdout/stderr.write of the cell are captured as "stream" messages. Synchronous code stops at
// its timeout (vm `timeout`) or on SIGINT (`breakOnSigint`); a promise the cell returns is awaited until the timeout.
// Arguments after the program (`node -e <this> [module ...]`) name modules to require before "ready" (a pool member's
// spare kernel, adopted by the sandbox's first context of the language); one that cannot be loaded is skipped, and
// `process.argv` holds only the node binary afterwards, as in a kernel started without them.
// With SANDKASTEN_KERNEL_LANGUAGE=typescript it is the TypeScript kernel: every cell is first transpiled by the
// `typescript` package the sandbox has (types are stripped, not checked; `import`s and top-level `await` are kept for
// the steps below), and it reports ready as "typescript"; without the package it exits at once, saying so.
'use strict';

const fs = require('fs');
const util = require('util');
const vm = require('vm');
const readline = require('readline');

let currentId = null;
let count = 0;
const language = process.env.SANDKASTEN_KERNEL_LANGUAGE === 'typescript' ? 'typescript' : 'javascript';
delete process.env.SANDKASTEN_KERNEL_LANGUAGE;

// Where Debian's node-typescript and npm's global typescript live.
const TYPESCRIPT_PATHS = ['/usr/share/nodejs/typescript', '/usr/lib/node_modules/typescript',
  '/usr/local/lib/node_modules/typescript'];

function loadTypescript() {
  for (const path of TYPESCRIPT_PATHS) {
    try {
      return require(path);
    } catch (_) {
      // Not there: the next place.
    }
  }
  process.stderr.write(`the typescript package is not in the sandbox (looked in ${TYPESCRIPT_PATHS.join(', ')})\n`);
  process.exit(3);
}
const typescript = language === 'typescript' ? loadTypescript() : null;

// TypeScript to JavaScript, one cell at a time; a syntax error is thrown as a SyntaxError naming its line.
function transpiled(source) {
  if (typescript === null) return source;
  const output = typescript.transpileModule(source, {
    reportDiagnostics: true,
    compilerOptions: {
      target: typescript.ScriptTarget.ES2022,
      module: typescript.ModuleKind.ESNext,
      removeComments: false,
      importsNotUsedAsValues: typescript.ImportsNotUsedAsValues ? typescript.ImportsNotUsedAsValues.Preserve : undefined,
    },
  });
  const problem = (output.diagnostics || []).find((d) => d.category === typescript.DiagnosticCategory.Error);
  if (problem) {
    const text = typescript.flattenDiagnosticMessageText(problem.messageText, '\n');
    const where = problem.file && problem.start !== undefined
      ? problem.file.getLineAndCharacterOfPosition(problem.start).line + 1 : null;
    throw new SyntaxError(where === null ? text : `${text} (line ${where})`);
  }
  // A module's empty export marker means nothing in a cell; the statement terminator the emitter adds last would
  // keep a top-level `await` cell's final expression from being its value (see `compile`).
  return output.outputText.replace(/^export \{\};\s*$/m, '').replace(/;\s*$/, '\n');
}

function send(message) {
  const data = Buffer.from(JSON.stringify(message) + '\n', 'utf8');
  let offset = 0;
  while (offset < data.length) {
    try {
      offset += fs.writeSync(1, data, offset);
    } catch (error) {
      if (error.code !== 'EAGAIN') throw error;
    }
  }
}

function emit(name, text) {
  if (text) send({ type: 'stream', id: currentId, name, text });
}

function chunkText(chunk, encoding) {
  if (typeof chunk === 'string') return chunk;
  return Buffer.from(chunk).toString(typeof encoding === 'string' ? encoding : 'utf8');
}

// Whatever writes to process.stdout / process.stderr is forwarded, never mixed into the protocol stream.
for (const [stream, name] of [[process.stdout, 'stdout'], [process.stderr, 'stderr']]) {
  stream.write = (chunk, encoding, callback) => {
    emit(name, chunkText(chunk, encoding));
    const done = typeof encoding === 'function' ? encoding : callback;
    if (typeof done === 'function') process.nextTick(done);
    return true;
  };
}

function format(args) {
  return util.formatWithOptions({ colors: false }, ...args) + '\n';
}

const captured = {
  log: (...args) => emit('stdout', format(args)),
  info: (...args) => emit('stdout', format(args)),
  debug: (...args) => emit('stdout', format(args)),
  warn: (...args) => emit('stderr', format(args)),
  error: (...args) => emit('stderr', format(args)),
  trace: (...args) => emit('stderr', format(['Trace:', ...args]) + new Error().stack.split('\n').slice(2).join('\n') + '\n'),
  dir: (value) => emit('stdout', util.inspect(value) + '\n'),
  table: (value) => emit('stdout', util.inspect(value) + '\n'),
};
const kernelConsole = Object.assign(Object.create(console), captured);

const sandbox = {
  console: kernelConsole,
  require,
  process,
  Buffer,
  URL,
  URLSearchParams,
  TextEncoder,
  TextDecoder,
  AbortController,
  structuredClone,
  setTimeout,
  setInterval,
  setImmediate,
  clearTimeout,
  clearInterval,
  clearImmediate,
  queueMicrotask,
  module: { exports: {} },
  __sandkastenDefault: (loaded) => (loaded && loaded.__esModule ? loaded.default : loaded),
  __dirname: process.cwd(),
  __filename: 'cell.js',
};
if (typeof fetch === 'function') sandbox.fetch = fetch;
sandbox.exports = sandbox.module.exports;
sandbox.global = sandbox;
sandbox.globalThis = sandbox;
const context = vm.createContext(sandbox);

function describeError(error, timeoutMs) {
  if (error && error.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') {
    return { name: 'TimeoutError', value: `the cell ran longer than ${timeoutMs} ms and was stopped`, traceback: [] };
  }
  if (error && error.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
    return { name: 'KeyboardInterrupt', value: 'the cell was interrupted', traceback: [] };
  }
  // Errors of the cell come from another realm: `instanceof Error` is false for them.
  if (error !== null && typeof error === 'object' && 'stack' in error) {
    const stack = String(error.stack || '').split('\n');
    // Frames of the kernel itself are not the user's business.
    const cut = stack.findIndex((line) => /node_kernel|\[eval\]|node:vm|node:internal/.test(line));
    const traceback = cut > 0 ? stack.slice(0, cut) : stack;
    return { name: String(error.name || 'Error'), value: String(error.message ?? ''), traceback };
  }
  return { name: 'Error', value: `uncaught ${util.inspect(error)}`, traceback: [] };
}

function bundle(value) {
  const result = { is_main_result: true, 'text/plain': util.inspect(value, { colors: false, depth: 4 }) };
  if (value && typeof value === 'object') {
    for (const [method, mime] of [['_repr_html_', 'text/html'], ['_repr_png_', 'image/png']]) {
      if (typeof value[method] === 'function') {
        try {
          const data = value[method]();
          if (data != null) result[mime] = mime === 'image/png' ? Buffer.from(data).toString('base64') : String(data);
        } catch (_) {
          // A broken renderer only loses that representation.
        }
      }
    }
  }
  return result;
}

// ESM `import` declarations (a cell is a script, not a module) become `require`s binding the same names, as `var`s
// so that a cell can be run again; a line count is kept so that error positions stay right.
const IMPORT_FROM = /^([ \t]*)import\s+(?!\(|type\s)([\w$*{][\s\S]*?)\s+from\s*(['"])([^'"\n]+)\3[ \t]*;?/gm;
const IMPORT_BARE = /^([ \t]*)import\s*(['"])([^'"\n]+)\2[ \t]*;?/gm;

function requireBindings(clause, source) {
  const from = `require(${JSON.stringify(source)})`;
  const statements = [];
  let rest = clause.trim();
  const defaultName = /^([\w$]+)\s*(,|$)/.exec(rest);
  if (defaultName) {
    statements.push(`var ${defaultName[1]} = __sandkastenDefault(${from});`);
    rest = rest.slice(defaultName[0].length).trim();
  }
  const namespace = /^\*\s*as\s+([\w$]+)$/.exec(rest);
  if (namespace) statements.push(`var ${namespace[1]} = ${from};`);
  const named = /^\{([\s\S]*)\}$/.exec(rest);
  if (named) {
    const names = named[1].split(',').map((name) => name.trim()).filter((name) => name && !name.startsWith('type '));
    const bindings = names.map((name) => name.replace(/^([\w$]+)\s+as\s+([\w$]+)$/, '$1: $2'));
    statements.push(`var { ${bindings.join(', ')} } = ${from};`);
  }
  return statements.join(' ');
}

function withoutImports(code) {
  const keepLines = (text) => '\n'.repeat((text.match(/\n/g) || []).length);
  return code
    .replace(IMPORT_FROM, (whole, indent, clause, _quote, source) =>
      indent + requireBindings(clause, source) + keepLines(whole))
    .replace(IMPORT_BARE, (whole, indent, _quote, source) => `${indent}require(${JSON.stringify(source)});`);
}

function compile(source, filename) {
  const code = withoutImports(source);
  try {
    return new vm.Script(code, { filename });
  } catch (error) {
    if (!(error instanceof SyntaxError) || !/await/.test(String(error.message)) || !/\bawait\b/.test(code)) throw error;
  }
  // Top-level await: run the cell as an async function; a lone expression's value is still returned.
  try {
    return new vm.Script(`(async () => (${code}\n))()`, { filename });
  } catch (_) {
    return new vm.Script(`(async () => {${code}\n})()`, { filename });
  }
}

function withTimeout(promise, ms) {
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error('timeout'), { code: 'ERR_SCRIPT_EXECUTION_TIMEOUT' })), ms);
  });
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
}

// Sets the cell's own environment variables; returns their previous values (undefined: unset) to put back.
function setCellEnv(env) {
  const previous = new Map();
  if (env === null || typeof env !== 'object') return previous;
  for (const [name, value] of Object.entries(env)) {
    previous.set(name, Object.prototype.hasOwnProperty.call(process.env, name) ? process.env[name] : undefined);
    process.env[name] = String(value);
  }
  return previous;
}

function restoreEnv(previous) {
  for (const [name, value] of previous) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
}

async function handle(request) {
  count += 1;
  currentId = request.id;
  const previousEnv = setCellEnv(request.env);
  const timeoutMs = Number.isInteger(request.timeout_ms) && request.timeout_ms > 0 ? request.timeout_ms : 2 ** 31 - 1;
  const started = Date.now();
  const results = [];
  let error = null;
  try {
    const script = compile(transpiled(String(request.code ?? '')), `cell-${count}.${language === 'typescript' ? 'ts' : 'js'}`);
    let value = script.runInContext(context, { timeout: timeoutMs, breakOnSigint: true, displayErrors: false });
    if (value && typeof value.then === 'function') {
      value = await withTimeout(Promise.resolve(value), Math.max(1, timeoutMs - (Date.now() - started)));
    }
    if (value !== undefined) {
      sandbox._ = value;
      results.push(bundle(value));
    }
  } catch (thrown) {
    error = describeError(thrown, timeoutMs);
  } finally {
    restoreEnv(previousEnv);
  }
  send({ type: 'reply', id: request.id, execution_count: count, results, error });
}

// An interrupt between cells (or while a promise is awaited) must not end the kernel.
process.on('SIGINT', () => {});
// Errors thrown later by timers or promises of earlier cells are reported as stderr, not fatal.
process.on('uncaughtException', (error) => emit('stderr', `Uncaught ${util.inspect(error)}\n`));
process.on('unhandledRejection', (reason) => emit('stderr', `Unhandled rejection: ${util.inspect(reason)}\n`));

const queue = [];
let busy = false;
let inputClosed = false;
async function drain() {
  if (busy) return;
  busy = true;
  while (queue.length > 0) {
    const line = queue.shift();
    let request;
    try {
      request = JSON.parse(line);
    } catch (parseError) {
      send({ type: 'reply', id: null, execution_count: count, results: [],
        error: { name: 'ProtocolError', value: String(parseError.message), traceback: [] } });
      continue;
    }
    await handle(request);
  }
  busy = false;
  if (inputClosed) process.exit(0);
}

const input = readline.createInterface({ input: fs.createReadStream(null, { fd: 0 }), crlfDelay: Infinity });
input.on('line', (line) => {
  queue.push(line);
  drain();
});
input.on('close', () => {
  inputClosed = true;
  if (!busy) process.exit(0);
});
for (const name of process.argv.splice(1)) {
  try {
    require(name);
  } catch (_) {
    // A module that cannot be loaded is simply not preloaded.
  }
}
send({ type: 'ready', language, pid: process.pid });
