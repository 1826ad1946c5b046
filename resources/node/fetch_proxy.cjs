// sandkasten: route Node's built-in fetch through the egress proxy named by HTTP_PROXY/HTTPS_PROXY.
//
// Node before 24 ignores the proxy variables in fetch (curl, pip, git, Python and npm honour them), so every
// long-lived sandbox preloads this file (NODE_OPTIONS=--require=...). It installs a dispatcher for fetch's
// undici engine that sends plain-HTTP requests to the proxy in absolute form and HTTPS requests through a CONNECT
// tunnel, then TLS to the real host (certificates are verified as usual, against Node's roots plus
// NODE_EXTRA_CA_CERTS). Hosts in NO_PROXY go direct. Nothing else of Node changes; with Node 24+ and
// NODE_USE_ENV_PROXY set, Node's own support is used instead.
'use strict';
(() => {
  const env = process.env;
  const proxyText = env.HTTPS_PROXY || env.https_proxy || env.HTTP_PROXY || env.http_proxy;
  if (!proxyText || typeof globalThis.fetch !== 'function') return;
  if (Number(process.versions.node.split('.')[0]) >= 24 && env.NODE_USE_ENV_PROXY) return;
  let proxy;
  try {
    proxy = new URL(proxyText);
  } catch {
    return;
  }
  const http = require('http');
  const https = require('https');
  const tls = require('tls');
  const noProxy = (env.NO_PROXY || env.no_proxy || '').split(',').map((s) => s.trim().toLowerCase()).filter(Boolean);
  const bypass = (host) =>
    noProxy.some((p) => p === '*' || host === p || host.endsWith(p.startsWith('.') ? p : '.' + p));

  // fetch hands headers over as an object, an array of pairs, or a flat array.
  const headerObject = (headers) => {
    const out = {};
    if (!headers) return out;
    if (Array.isArray(headers)) {
      if (headers.length && Array.isArray(headers[0])) for (const [k, v] of headers) out[k] = v;
      else for (let i = 0; i + 1 < headers.length; i += 2) out[headers[i]] = headers[i + 1];
    } else if (typeof headers[Symbol.iterator] === 'function' && typeof headers !== 'string') {
      for (const [k, v] of headers) out[k] = v;
    } else {
      Object.assign(out, headers);
    }
    return out;
  };

  const writeBody = (req, body) => {
    if (body == null) return req.end();
    if (typeof body === 'string' || body instanceof Uint8Array) return req.end(body);
    if (typeof body[Symbol.asyncIterator] === 'function' || typeof body[Symbol.iterator] === 'function') {
      (async () => {
        for await (const chunk of body) req.write(chunk);
        req.end();
      })().catch((err) => req.destroy(err));
      return undefined;
    }
    return req.end(String(body));
  };

  const dispatcher = {
    dispatch(opts, handler) {
      const target = new URL(opts.origin);
      const secure = target.protocol === 'https:';
      const port = Number(target.port) || (secure ? 443 : 80);
      const host = target.hostname.replace(/^\[|\]$/g, '');
      const headers = headerObject(opts.headers);
      headers.host = target.host;
      let current = null;
      let failed = false;
      const fail = (err) => {
        if (failed) return;
        failed = true;
        handler.onError(err);
      };
      if (handler.onConnect) handler.onConnect((err) => current && current.destroy(err || new Error('aborted')));
      const onResponse = (res) => {
        const raw = res.rawHeaders.map((h) => Buffer.from(h));
        if (handler.onResponseStarted) handler.onResponseStarted();
        handler.onHeaders(res.statusCode, raw, () => res.resume(), res.statusMessage);
        res.on('data', (chunk) => {
          if (handler.onData(chunk) === false) res.pause();
        });
        res.on('end', () => handler.onComplete([]));
        res.on('error', fail);
      };
      const send = (req) => {
        current = req;
        req.on('error', fail);
        writeBody(req, opts.body);
      };
      const base = { method: opts.method, headers, agent: false };
      if (bypass(host.toLowerCase())) {
        const lib = secure ? https : http;
        send(lib.request({ ...base, host, port, path: opts.path, servername: host }, onResponse));
      } else if (!secure) {
        const path = `${target.protocol}//${target.host}${opts.path}`;
        send(http.request({ ...base, host: proxy.hostname, port: Number(proxy.port) || 80, path }, onResponse));
      } else {
        const authority = `${target.hostname}:${port}`;
        const connect = http.request({
          host: proxy.hostname,
          port: Number(proxy.port) || 80,
          method: 'CONNECT',
          path: authority,
          headers: { host: authority },
          agent: false,
        });
        current = connect;
        connect.on('connect', (res, socket, head) => {
          if (res.statusCode !== 200) {
            socket.destroy();
            const reason = head && head.length ? `: ${head.toString().trim()}` : '';
            fail(new Error(`egress proxy refused CONNECT ${authority} (${res.statusCode} ${res.statusMessage})${reason}`));
            return;
          }
          // No agent: with createConnection and no agent, Node uses the tunnel instead of dialling (and resolving).
          const createConnection = () => tls.connect({ socket, servername: host, ALPNProtocols: ['http/1.1'] });
          const options = { method: opts.method, headers, host, port, path: opts.path, servername: host, createConnection };
          send(https.request(options, onResponse));
        });
        connect.on('error', fail);
        connect.end();
      }
      return true;
    },
    close() {
      return Promise.resolve();
    },
    destroy() {
      return Promise.resolve();
    },
  };
  globalThis[Symbol.for('undici.globalDispatcher.1')] = dispatcher;
})();
