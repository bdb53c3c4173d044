// Starling interop peer: a stock js-libp2p node (TCP, Noise, Yamux, identify,
// identify-push, ping) plus the test protocol /starling/echo/1.0.0, used to
// check the C++ libp2p host against an implementation nobody here wrote.
//
//   node --import ./polyfill.mjs peer.mjs listen [--port 0] [--host 127.0.0.1]
//   node --import ./polyfill.mjs peer.mjs dial <multiaddr/p2p/ID> [--echo-bytes N] [--streams N]
//   node --import ./polyfill.mjs peer.mjs versions   (installation check)
//
// See ../README.md for every option, the output format and the wire notes.
// stdout carries exactly one JSON line; everything else goes to stderr as
// JSON lines ({"t":ms,"event":...}).

import { createHash, randomBytes } from 'node:crypto'
import { setMaxListeners } from 'node:events'
import { fstatSync, readFileSync } from 'node:fs'
import process from 'node:process'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { generateKeyPair, generateKeyPairFromSeed } from '@libp2p/crypto/keys'
import { identify, identifyPush } from '@libp2p/identify'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

export const ECHO_PROTOCOL = '/starling/echo/1.0.0'
const MiB = 1024 * 1024
const T0 = Date.now()

// ---------------------------------------------------------------- utilities

function log (event, fields = {}) {
  process.stderr.write(JSON.stringify({ t: Date.now() - T0, event, ...fields }) + '\n')
}

function usage (msg) {
  if (msg != null) process.stderr.write(`peer.mjs: ${msg}\n`)
  process.stderr.write(`usage:
  node --import ./polyfill.mjs peer.mjs listen [--port 0] [--host 127.0.0.1]
       [--key-seed HEX32] [--inbound-threshold N] [--exit-after SEC] [--stdin auto|watch|ignore]
  node --import ./polyfill.mjs peer.mjs dial <multiaddr-with-/p2p/> [--echo-bytes 10485760]
       [--streams 8] [--stream-bytes 1048576] [--step-timeout 60] [--key-seed HEX32]
       [--skip ping,identify,echo,concurrent]
  node --import ./polyfill.mjs peer.mjs versions
`)
  process.exit(2)
}

function parseArgs (argv) {
  const [mode, ...rest] = argv
  if (mode === 'versions') return { mode }
  if (mode !== 'listen' && mode !== 'dial') usage(`unknown mode ${JSON.stringify(mode)}`)
  const opts = {
    mode,
    target: undefined,
    port: 0,
    host: '127.0.0.1',
    keySeed: undefined,
    inboundThreshold: 1000,
    exitAfter: 0,
    stdin: 'auto',
    echoBytes: 10 * MiB,
    streams: 8,
    streamBytes: MiB,
    stepTimeout: 60,
    skip: new Set()
  }
  const num = (name, v, min) => {
    const n = Number(v)
    if (!Number.isSafeInteger(n) || n < min) usage(`${name} needs an integer >= ${min}, got ${JSON.stringify(v)}`)
    return n
  }
  for (let i = 0; i < rest.length; i++) {
    const a = rest[i]
    if (!a.startsWith('--')) {
      if (mode === 'dial' && opts.target === undefined) { opts.target = a; continue }
      usage(`unexpected argument ${JSON.stringify(a)}`)
    }
    const v = rest[++i]
    if (v === undefined) usage(`${a} needs a value`)
    switch (a) {
      case '--port': opts.port = num(a, v, 0); break
      case '--host': opts.host = v; break
      case '--key-seed':
        if (!/^[0-9a-fA-F]{64}$/.test(v)) usage('--key-seed needs 64 hex digits (a 32-byte Ed25519 seed)')
        opts.keySeed = Uint8Array.from(Buffer.from(v, 'hex'))
        break
      case '--inbound-threshold': opts.inboundThreshold = num(a, v, 1); break
      case '--exit-after': opts.exitAfter = num(a, v, 0); break
      case '--stdin':
        if (!['auto', 'watch', 'ignore'].includes(v)) usage('--stdin is auto, watch or ignore')
        opts.stdin = v
        break
      case '--echo-bytes': opts.echoBytes = num(a, v, 0); break
      case '--streams': opts.streams = num(a, v, 0); break
      case '--stream-bytes': opts.streamBytes = num(a, v, 0); break
      case '--step-timeout': opts.stepTimeout = num(a, v, 1); break
      case '--skip':
        for (const s of v.split(',').filter(Boolean)) {
          if (!['ping', 'identify', 'echo', 'concurrent'].includes(s)) usage(`--skip: unknown step ${s}`)
          opts.skip.add(s)
        }
        break
      default: usage(`unknown option ${a}`)
    }
  }
  if (mode === 'dial') {
    if (opts.target === undefined) usage('dial needs a multiaddr')
    let ma
    try { ma = multiaddr(opts.target) } catch (err) { usage(`bad multiaddr: ${err.message}`) }
    if (ma.getComponents().find(c => c.name === 'p2p') == null) usage('the multiaddr must end in /p2p/<peer id>')
    opts.target = ma
  }
  return opts
}

function toBytes (data) {
  // stream 'message' events carry a Uint8Array or a Uint8ArrayList
  return data instanceof Uint8Array ? data : data.subarray()
}

function sha256 (buf) {
  return createHash('sha256').update(buf).digest('hex')
}

// Runs fn(signal) and rejects after `seconds` with a message naming the step.
async function step (name, seconds, fn) {
  const ac = new AbortController()
  setMaxListeners(Infinity, ac.signal) // one listener per concurrent stream
  let timer
  const timeout = new Promise((resolve, reject) => {
    timer = setTimeout(() => {
      const err = new Error(`${name}: timed out after ${seconds} s`)
      ac.abort(err)
      reject(err)
    }, seconds * 1000)
  })
  try {
    return await Promise.race([fn(ac.signal), timeout])
  } catch (err) {
    throw new Error(err.message?.startsWith(`${name}:`) ? err.message : `${name}: ${err.name ?? 'Error'}: ${err.message}`)
  } finally {
    clearTimeout(timer)
  }
}

// ---------------------------------------------------------------- echo

// Server side of /starling/echo/1.0.0: write back every byte, respect the
// write side's backpressure by pausing reads, and close the write side once
// the remote has closed its write side and everything was echoed.
function serveEcho (stream, connection) {
  // A paused yamux stream still receives up to the window it granted (js
  // auto-tunes windows up to 16 MiB) while the default read buffer limit is
  // 4 MiB; raise it so backpressure never turns into a reset.
  stream.maxReadBufferLength = 64 * MiB
  let bytes = 0
  return new Promise((resolve) => {
    const finish = (how, err) => {
      log('echo:done', { peer: connection.remotePeer.toString(), stream: stream.id, bytes, how, error: err?.message })
      resolve()
    }
    stream.addEventListener('message', (evt) => {
      bytes += evt.data.byteLength
      try {
        if (!stream.send(evt.data)) {
          stream.pause()
          stream.onDrain().then(() => {
            if (stream.readStatus === 'paused') stream.resume()
          }, () => {})
        }
      } catch (err) {
        stream.abort(err)
      }
    })
    const onEnd = () => {
      stream.close().then(() => {}, (err) => stream.abort(err))
    }
    if (stream.readableEnded) onEnd()
    else stream.addEventListener('end', onEnd, { once: true })
    stream.addEventListener('close', (evt) => finish(evt.error == null ? 'closed' : 'error', evt.error), { once: true })
  })
}

// Client side: send `payload` on a new echo stream, close the write side, read
// until the remote closes, and compare what came back.
async function runEcho (node, target, payload, signal) {
  const start = performance.now()
  const stream = await node.dialProtocol(target, ECHO_PROTOCOL, { signal })
  stream.maxReadBufferLength = 64 * MiB
  const hash = createHash('sha256')
  let received = 0
  const done = new Promise((resolve, reject) => {
    stream.addEventListener('message', (evt) => {
      const buf = toBytes(evt.data)
      received += buf.byteLength
      hash.update(buf)
    })
    stream.addEventListener('close', (evt) => {
      if (evt.error != null) reject(evt.error)
      else resolve()
    }, { once: true })
    const onEnd = () => resolve()
    if (stream.readableEnded) onEnd()
    else stream.addEventListener('end', onEnd, { once: true })
    signal.addEventListener('abort', () => {
      stream.abort(signal.reason)
      reject(signal.reason)
    }, { once: true })
  })
  done.catch(() => {}) // observed below; avoid an unhandled rejection meanwhile
  const chunk = 64 * 1024
  for (let off = 0; off < payload.byteLength; off += chunk) {
    if (!stream.send(payload.subarray(off, Math.min(off + chunk, payload.byteLength)))) {
      await stream.onDrain({ signal })
    }
  }
  await stream.close({ signal })
  await done
  const ms = performance.now() - start
  const expected = sha256(payload)
  const got = hash.digest('hex')
  return {
    bytes: payload.byteLength,
    received,
    sha256_match: received === payload.byteLength && got === expected,
    ms: Math.round(ms * 10) / 10,
    mib_per_s: ms > 0 ? Math.round(payload.byteLength / MiB / (ms / 1000) * 10) / 10 : null
  }
}

// ---------------------------------------------------------------- node

async function makeNode (opts) {
  const privateKey = opts.keySeed != null
    ? await generateKeyPairFromSeed('Ed25519', opts.keySeed)
    : await generateKeyPair('Ed25519')
  const listen = opts.mode === 'listen'
  const node = await createLibp2p({
    privateKey,
    addresses: { listen: listen ? [`/ip4/${opts.host}/tcp/${opts.port}`] : [] },
    transports: [tcp()],
    connectionEncrypters: [noise()],
    streamMuxers: [yamux()],
    connectionManager: {
      // js default is 5 inbound connections per second per host, which a test
      // that reconnects in a loop from 127.0.0.1 hits quickly
      inboundConnectionThreshold: opts.inboundThreshold
    },
    services: {
      // Identify is started by hand on every new connection (listen mode) or
      // after the dial (dial mode), exactly when js would start it itself, so
      // that failures can be logged and reported; js swallows them otherwise.
      identify: identify({ runOnConnectionOpen: false }),
      identifyPush: identifyPush(),
      ping: ping()
    }
  })
  await node.handle(ECHO_PROTOCOL, serveEcho, { maxInboundStreams: 1024, maxOutboundStreams: 1024 })

  node.addEventListener('connection:open', (evt) => {
    const c = evt.detail
    log('connection:open', {
      peer: c.remotePeer.toString(),
      remoteAddr: c.remoteAddr.toString(),
      direction: c.direction,
      encryption: c.encryption,
      multiplexer: c.multiplexer
    })
    if (listen) {
      // success is logged by the peer:identify event below
      node.services.identify.identify(c).catch((err) => {
        log('identify:failed', { peer: c.remotePeer.toString(), error: `${err.name}: ${err.message}` })
      })
    }
    // Log every stream on the connection once it ends, with its negotiated
    // protocol. The muxer is not public API; logging only, so tolerate its
    // absence.
    const muxer = c.muxer
    if (muxer?.addEventListener != null) {
      muxer.addEventListener('stream', (sevt) => {
        const s = sevt.detail
        log('stream:inbound', { peer: c.remotePeer.toString(), stream: s.id })
        s.addEventListener('close', (cevt) => {
          log('stream:closed', {
            peer: c.remotePeer.toString(),
            stream: s.id,
            direction: s.direction,
            protocol: s.protocol,
            status: s.status,
            error: cevt.error?.message
          })
        }, { once: true })
      })
    }
  })
  node.addEventListener('connection:close', (evt) => {
    const c = evt.detail
    log('connection:close', { peer: c.remotePeer.toString(), remoteAddr: c.remoteAddr.toString(), status: c.status })
  })
  node.addEventListener('peer:identify', (evt) => {
    log('peer:identify', identifyToJson(evt.detail))
  })
  return node
}

function identifyToJson (r) {
  return {
    peer: r.peerId.toString(),
    protocolVersion: r.protocolVersion,
    agentVersion: r.agentVersion,
    protocols: r.protocols,
    listenAddrs: r.listenAddrs.map(a => a.toString()),
    observedAddr: r.observedAddr?.toString(),
    signedPeerRecord: r.signedPeerRecord == null
      ? null
      : { seq: r.signedPeerRecord.seq.toString(), addresses: r.signedPeerRecord.addresses.map(a => a.toString()) }
  }
}

// ---------------------------------------------------------------- modes

async function listenMode (opts) {
  const node = await makeNode(opts)
  process.stdout.write(JSON.stringify({
    peerId: node.peerId.toString(),
    addrs: node.getMultiaddrs().map(a => a.toString())
  }) + '\n')

  let stopping = false
  const stop = async (why) => {
    if (stopping) return
    stopping = true
    log('stop', { why })
    const force = setTimeout(() => process.exit(0), 5000)
    force.unref()
    try { await node.stop() } catch (err) { log('stop:error', { error: err.message }) }
    process.exit(0)
  }
  process.on('SIGTERM', () => { void stop('SIGTERM') })
  process.on('SIGINT', () => { void stop('SIGINT') })
  // Watch stdin only when it is a pipe or socket: /dev/null or a closed stdin
  // would otherwise stop the node at once, and a terminal has Ctrl-C.
  let watch = opts.stdin === 'watch'
  if (opts.stdin === 'auto') {
    try {
      const st = fstatSync(0)
      watch = st.isFIFO() || st.isSocket()
    } catch {
      watch = false
    }
  }
  if (watch) {
    process.stdin.on('end', () => { void stop('stdin closed') })
    process.stdin.on('error', () => { void stop('stdin error') })
    process.stdin.resume()
  }
  if (opts.exitAfter > 0) setTimeout(() => { void stop('exit-after') }, opts.exitAfter * 1000)
  log('listening', { stdin: watch ? 'watched' : 'ignored' })
}

async function dialMode (opts) {
  const t = opts.stepTimeout
  const result = { ok: false }
  let node
  try {
    node = await makeNode(opts)
    const target = opts.target
    const remote = target.getComponents().findLast(c => c.name === 'p2p').value

    const conn = await step('dial', t, (signal) => node.dial(target, { signal }))
    result.peerId = node.peerId.toString()
    result.remotePeer = conn.remotePeer.toString()
    if (result.remotePeer !== remote) throw new Error(`dial: connected to ${result.remotePeer}, expected ${remote}`)
    result.connection = {
      remoteAddr: conn.remoteAddr.toString(),
      encryption: conn.encryption,
      multiplexer: conn.multiplexer
    }
    log('dialed', result.connection)

    if (!opts.skip.has('ping')) {
      result.ping_ms = await step('ping', t, (signal) => node.services.ping.ping(target, { signal }))
      log('ping', { ms: result.ping_ms })
    }
    if (!opts.skip.has('identify')) {
      // js reads Identify messages until the remote closes its write side, so a
      // responder that forgets the FIN shows up here as a timeout
      const idTimeout = Math.min(t, 10)
      const started = performance.now()
      let r
      try {
        r = await step('identify', idTimeout, (signal) => node.services.identify.identify(conn, { signal }))
      } catch (err) {
        throw new Error(err.message.includes('timed out')
          ? `${err.message} (does the remote close its write side after the Identify message?)`
          : err.message)
      }
      result.identify = { ...identifyToJson(r), ms: Math.round((performance.now() - started) * 10) / 10 }
    }
    if (!opts.skip.has('echo')) {
      const payload = randomBytes(opts.echoBytes)
      result.echo = await step('echo', t, (signal) => runEcho(node, target, payload, signal))
      log('echo', result.echo)
      if (!result.echo.sha256_match) throw new Error(`echo: data came back different (${result.echo.received}/${result.echo.bytes} bytes)`)
    }
    if (!opts.skip.has('concurrent') && opts.streams > 0) {
      const start = performance.now()
      const runs = await step('concurrent', t, (signal) => Promise.all(
        Array.from({ length: opts.streams }, () => runEcho(node, target, randomBytes(opts.streamBytes), signal))))
      const ms = performance.now() - start
      const total = runs.reduce((s, r) => s + r.bytes, 0)
      result.concurrent = {
        streams: runs.length,
        bytes_each: opts.streamBytes,
        all_match: runs.every(r => r.sha256_match),
        ms: Math.round(ms * 10) / 10,
        mib_per_s: ms > 0 ? Math.round(total / MiB / (ms / 1000) * 10) / 10 : null,
        per_stream_ms: runs.map(r => r.ms)
      }
      log('concurrent', result.concurrent)
      if (!result.concurrent.all_match) throw new Error('concurrent: some stream came back different')
    }
    result.ok = true
  } catch (err) {
    result.ok = false
    result.error = err.message
  }
  if (node != null) {
    await Promise.race([node.stop().catch(() => {}), new Promise(resolve => setTimeout(resolve, 5000).unref())])
  }
  const { ok, error, ...rest } = result
  const line = JSON.stringify(ok ? { ok, ...rest } : { ok, error, ...rest }) + '\n'
  process.stdout.write(line, () => process.exit(ok ? 0 : 1))
}

// Prints the installed versions; exits non-zero if an import above failed
// (it never gets here then) or a package is missing.
function versionsMode () {
  const names = ['libp2p', '@chainsafe/libp2p-noise', '@chainsafe/libp2p-yamux', '@libp2p/tcp',
    '@libp2p/identify', '@libp2p/ping', '@libp2p/crypto', '@multiformats/multiaddr']
  const versions = { node: process.versions.node }
  let ok = typeof Promise.withResolvers === 'function'
  for (const n of names) {
    try {
      versions[n] = JSON.parse(readFileSync(new URL(`./node_modules/${n}/package.json`, import.meta.url), 'utf8')).version
    } catch {
      versions[n] = null
      ok = false
    }
  }
  process.stdout.write(JSON.stringify({ ok, versions }) + '\n', () => process.exit(ok ? 0 : 1))
}

const opts = parseArgs(process.argv.slice(2))
if (opts.mode === 'versions') {
  versionsMode()
} else if (opts.mode === 'listen') {
  listenMode(opts).catch((err) => {
    process.stdout.write(JSON.stringify({ ok: false, error: `listen: ${err.message}` }) + '\n', () => process.exit(1))
  })
} else {
  // a last-resort watchdog in case a step ignores its abort signal
  const budget = (opts.stepTimeout * 6 + 10) * 1000
  setTimeout(() => {
    process.stdout.write(JSON.stringify({ ok: false, error: `watchdog: no result after ${budget / 1000} s` }) + '\n', () => process.exit(1))
  }, budget).unref()
  dialMode(opts)
}
