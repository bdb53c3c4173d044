// js-libp2p peers for the NAT interop cases (tests/netlab/netlab_interop_nat.sh) and the js
// anchor of `make bench-nat` (bench/run-nat-js.sh), beside peer.mjs:
//
//   node --import ./polyfill.mjs nat.mjs relay --listen /ip4/IP/tcp/PORT [--autonat-dial-new]
//       a public js relay server (circuit relay v2 hop) that also serves AutoNAT v1, identify
//       and ping; it announces its listen address (a js relay puts only announced addresses in
//       reservations)
//   node --import ./polyfill.mjs nat.mjs peer [options]
//       --listen MA          a TCP listen address (repeatable; none by default)
//       --relay MA           hold a reservation with this relay (/p2p-circuit listen address)
//       --dial MA            dial this multiaddr (e.g. a /p2p-circuit address), then ping it
//       --ping-every MS      ping the dialed peer this often (default 300)
//       --dcutr              run @libp2p/dcutr
//       --dcutr-roles-fix    as DCUtR's B, be the punched connection's server (js 3.3.11's dial
//                            queue drops DCUtR's `initiator: false`, so js B acts as multistream
//                            dialer and Noise initiator like A, and its yamux is a client
//                            because the socket dialed: the connection fails)
//       --autonat            run @libp2p/autonat (client and server)
//       --autonat-dial-new   make the AutoNAT server dial back on a new connection (js 3.3.11's
//                            server asks for any connection to the requester, gets the one the
//                            request came over, judges by its address, then closes it: the
//                            answer is never sent and the requester loses that connection)
//       --local-port N       dial every TCP connection from local port N (Node has no
//                            SO_REUSEPORT, so this peer then has no TCP listener: that is how
//                            js can dial a hole punch from the port its NAT mapping belongs to)
//       --observed adopt     offer the TCP address a peer observed over a direct connection
//                            (js ignores it) in DCUtR CONNECT messages, without announcing it
//                            in identify (a js B would first try a doomed direct dial to it:
//                            5 s lost, and the punch then fails with EADDRNOTAVAIL)
//       --candidate MA       add MA as an unconfirmed observed address (AutoNAT checks it)
//       --exit-after S       stop after S seconds (default 300)
//
// stdout: one JSON object per line, each with "event" and "t" (ms since start): ready, addrs,
// reserved, identify, conn:open, conn:close, ping, ping:error, autonat, dial:error.
// stderr: js-libp2p's own debug log (DEBUG=libp2p:dcutr*,...) and errors.
import process from 'node:process'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { autoNAT } from '@libp2p/autonat'
import { circuitRelayServer, circuitRelayTransport } from '@libp2p/circuit-relay-v2'
import { dcutr } from '@libp2p/dcutr'
import { identify } from '@libp2p/identify'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

const t0 = Date.now()
const emit = (event, fields = {}) =>
  process.stdout.write(JSON.stringify({ event, t: Date.now() - t0, ...fields }) + '\n')

function parseArgs (argv) {
  const o = { listen: [], relay: [], pingEvery: 300, exitAfter: 300 }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const val = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`)
      return argv[++i]
    }
    if (a === '--listen') o.listen.push(val())
    else if (a === '--relay') o.relay.push(val())
    else if (a === '--dial') o.dial = val()
    else if (a === '--ping-every') o.pingEvery = Number(val())
    else if (a === '--dcutr') o.dcutr = true
    else if (a === '--dcutr-roles-fix') o.dcutrRolesFix = true
    else if (a === '--autonat') o.autonat = true
    else if (a === '--autonat-dial-new') o.autonatDialNew = true
    else if (a === '--local-port') o.localPort = Number(val())
    else if (a === '--observed') o.observed = val()
    else if (a === '--candidate') o.candidate = val()
    else if (a === '--exit-after') o.exitAfter = Number(val())
    else usage(`unknown option ${a}`)
  }
  if (o.observed != null && o.observed !== 'adopt') usage('--observed adopt')
  if (!(o.pingEvery > 0) || !(o.exitAfter > 0)) usage('--ping-every and --exit-after must be > 0')
  return o
}

function usage (why) {
  process.stderr.write(`nat.mjs: ${why}\nusage: nat.mjs relay --listen MA | nat.mjs peer [options] (see the header)\n`)
  process.exit(2)
}

const isCircuit = (ma) => ma.toString().includes('/p2p-circuit')
const connFields = (c) => ({
  peer: c.remotePeer.toString(),
  addr: c.remoteAddr.toString(),
  dir: c.direction,
  limited: c.limits != null
})

function logConnections (node) {
  node.addEventListener('connection:open', (e) => emit('conn:open', connFields(e.detail)))
  node.addEventListener('connection:close', (e) => emit('conn:close', connFields(e.detail)))
  node.addEventListener('peer:identify', (e) => emit('identify', {
    peer: e.detail.peerId.toString(),
    agent: e.detail.agentVersion,
    observed: e.detail.observedAddr?.toString(),
    addr: e.detail.connection.remoteAddr.toString()
  }))
}

function stopAfter (node, seconds) {
  let stopping = false
  const stop = async (code) => {
    if (stopping) return
    stopping = true
    const force = setTimeout(() => process.exit(code), 3000)  // bounded shutdown
    force.unref()
    try { await node.stop() } catch {}
    process.exit(code)
  }
  process.on('SIGTERM', () => stop(0))
  process.on('SIGINT', () => stop(0))
  setTimeout(() => stop(0), seconds * 1000).unref()
}

// One ping (/ipfs/ping/1.0.0: 32 bytes out, the same 32 back) over the connection js would
// use for a new stream: a direct one if there is one, else the relayed (limited) one.
async function pingOnce (node, peer) {
  const conns = node.getConnections(peer).filter((c) => c.status === 'open')
  const conn = conns.find((c) => c.limits == null) ?? conns[0]
  if (conn == null) throw new Error('no connection')
  const signal = AbortSignal.timeout(5000)
  const start = performance.now()
  const stream = await conn.newStream('/ipfs/ping/1.0.0', { signal, runOnLimitedConnection: true })
  const data = crypto.getRandomValues(new Uint8Array(32))
  let got = 0
  const done = new Promise((resolve, reject) => {
    stream.addEventListener('message', (evt) => {
      got += evt.data.byteLength
      if (got >= 32) resolve()
    })
    stream.addEventListener('close', (evt) => reject(evt.error ?? new Error('closed early')), { once: true })
    signal.addEventListener('abort', () => reject(new Error('ping timed out')), { once: true })
  })
  stream.send(data)
  await done
  const rtt = performance.now() - start
  await stream.close({ signal }).catch(() => stream.abort(new Error('close')))
  return { rtt: Math.round(rtt * 100) / 100, ...connFields(conn) }
}

// --autonat-dial-new: the AutoNAT service's dial-backs get force: true (a new connection).
function autonatDialNew (node) {
  const svc = node.services.autonat
  const cm = svc.components.connectionManager
  const forced = {
    openConnection: (target, options = {}) => cm.openConnection(target, { ...options, force: true }),
    getConnections: (...a) => cm.getConnections(...a),
    getMaxConnections: () => cm.getMaxConnections(),
    isDialable: (...a) => cm.isDialable(...a)
  }
  svc.components = new Proxy(svc.components, {
    get: (target, prop) => prop === 'connectionManager' ? forced : target[prop]
  })
}

// --dcutr-roles-fix: DCUtR's B asks for its punch dials with `initiator: false`, which js's dial
// queue drops on the way to the transport. The addresses B punches are noted, and the transport
// manager's dial puts the flag back for them, so the upgrader runs as multistream listener and
// Noise responder; yamux takes client/server from the socket's direction, which is set to
// inbound for those dials. B is then the server of the punched connection, as the spec asks.
function dcutrRolesFix (node) {
  const svc = node.services.dcutr
  const cm = svc.connectionManager
  const tm = node.components.transportManager
  const asResponder = new Set()
  const key = (ma) => ma.toString().replace(/\/p2p\/[^/]+$/, '')
  const openConnection = async (target, options = {}) => {
    if (options.initiator !== false) return cm.openConnection(target, options)
    const addrs = (Array.isArray(target) ? target : [target]).map(key)
    addrs.forEach((a) => asResponder.add(a))
    try {
      return await cm.openConnection(target, options)
    } finally {
      addrs.forEach((a) => asResponder.delete(a))
    }
  }
  svc.connectionManager = new Proxy(cm, {
    get: (t, prop) => {
      if (prop === 'openConnection') return openConnection
      const v = t[prop]
      return typeof v === 'function' ? v.bind(t) : v
    }
  })
  const dial = tm.dial.bind(tm)
  tm.dial = (ma, options = {}) => dial(ma, asResponder.has(key(ma)) ? { ...options, initiator: false } : options)
  // yamux picks client/server from the raw socket's direction: make the socket say inbound.
  const upgrader = node.components.upgrader
  const upgradeOutbound = upgrader.upgradeOutbound.bind(upgrader)
  upgrader.upgradeOutbound = (maConn, opts) => {
    if (opts?.initiator === false) maConn.direction = 'inbound'
    return upgradeOutbound(maConn, opts)
  }
}

const [mode, ...rest] = process.argv.slice(2)
const common = {
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  connectionManager: { inboundConnectionThreshold: 1000 }
}

if (mode === 'relay') {
  const o = parseArgs(rest)
  if (o.listen.length !== 1) usage('relay needs one --listen /ip4/IP/tcp/PORT')
  const node = await createLibp2p({
    ...common,
    start: false,
    addresses: { listen: o.listen, announce: o.listen },
    transports: [tcp()],
    services: {
      identify: identify(),
      ping: ping(),
      autonat: autoNAT(),
      relay: circuitRelayServer({ reservations: { maxReservations: 64 } })
    }
  })
  if (o.autonatDialNew) autonatDialNew(node)
  logConnections(node)
  await node.start()
  emit('ready', { id: node.peerId.toString(), addrs: node.getMultiaddrs().map(String) })
  stopAfter(node, o.exitAfter)
} else if (mode === 'peer') {
  const o = parseArgs(rest)
  const services = { identify: identify(), ping: ping() }
  if (o.dcutr) services.dcutr = dcutr()
  if (o.autonat) services.autonat = autoNAT()
  const node = await createLibp2p({
    ...common,
    start: false,  // listeners first: the relay connection opens during start()
    addresses: { listen: [...o.listen, ...o.relay.map((r) => `${r}/p2p-circuit`)] },
    transports: [
      tcp(o.localPort != null ? { dialOpts: { localPort: o.localPort } } : {}),
      circuitRelayTransport()
    ],
    services
  })
  logConnections(node)
  const am = node.components.addressManager
  if (o.candidate != null) am.addObservedAddr(multiaddr(o.candidate))
  let adopted
  const observedSeen = new Promise((resolve) => { adopted = resolve })
  if (o.observed != null) {
    // js ignores observed TCP addresses (identify.js, js-libp2p issue 2620); take the one a
    // peer reports over a direct connection and offer it where DCUtR reads our addresses.
    const offered = []
    node.addEventListener('peer:identify', (e) => {
      const ob = e.detail.observedAddr
      if (ob == null || isCircuit(e.detail.connection.remoteAddr) || !ob.toString().includes('/tcp/')) return
      const clean = multiaddr(ob.toString().replace(/\/p2p\/[^/]+$/, '') + `/p2p/${node.peerId}`)
      if (offered.some((m) => m.equals(clean))) return
      offered.push(clean)
      emit('observed', { addr: clean.toString() })
      adopted()
    })
    if (o.dcutr) {
      const svc = node.services.dcutr
      svc.addressManager = new Proxy(am, {
        get: (t, prop) => prop === 'getAddresses'
          ? () => [...t.getAddresses(), ...offered]
          : (typeof t[prop] === 'function' ? t[prop].bind(t) : t[prop])
      })
    }
  }
  if (o.autonat) {
    // Report every AutoNAT answer: the success/failure counts js keeps for the address asked.
    const svc = node.services.autonat
    const ask = svc.askPeerToVerify.bind(svc)
    svc.askPeerToVerify = async (connection, segment, options) => {
      const key = options.multiaddr.toString()
      const results = svc.dialResults.get(key)
      try {
        await ask(connection, segment, options)
      } finally {
        emit('autonat', {
          server: connection.remotePeer.toString(),
          addr: key,
          success: results?.success ?? null,
          failure: results?.failure ?? null,
          verified: node.getMultiaddrs().some((m) => m.toString().startsWith(key))
        })
      }
    }
  }
  if (o.autonat && o.autonatDialNew) autonatDialNew(node)
  if (o.dcutr && o.dcutrRolesFix) dcutrRolesFix(node)
  let lastAddrs = ''
  node.addEventListener('self:peer:update', () => {
    const addrs = node.getMultiaddrs().map(String)
    if (addrs.join() === lastAddrs) return
    lastAddrs = addrs.join()
    emit('addrs', { addrs })
    const circuit = addrs.filter((a) => a.includes('/p2p-circuit'))
    if (circuit.length > 0) emit('reserved', { circuit })
  })
  await node.start()
  emit('ready', { id: node.peerId.toString(), addrs: node.getMultiaddrs().map(String) })
  stopAfter(node, o.exitAfter)
  if (o.dial != null) {
    const target = multiaddr(o.dial)
    let conn
    try {
      // With --observed and a /p2p-circuit target: reach the relay first and take the address
      // it observed, so that DCUtR's CONNECT carries it (bounded wait).
      const [relayPart] = o.dial.split('/p2p-circuit')
      if (o.observed != null && relayPart !== o.dial) {
        await node.dial(multiaddr(relayPart), { signal: AbortSignal.timeout(15000) })
        await Promise.race([observedSeen, new Promise((resolve) => setTimeout(resolve, 10000))])
      }
      emit('dialing', { addr: o.dial })
      conn = await node.dial(target, { signal: AbortSignal.timeout(15000) })
      emit('dialed', connFields(conn))
    } catch (err) {
      emit('dial:error', { error: `${err.name}: ${err.message}` })
    }
    if (conn != null) {
      let n = 0
      const tick = async () => {
        n++
        try {
          emit('ping', { n, ...(await pingOnce(node, conn.remotePeer)) })
        } catch (err) {
          emit('ping:error', { n, error: `${err.name}: ${err.message}` })
        }
        setTimeout(tick, o.pingEvery).unref()
      }
      tick()
    }
  }
} else {
  usage('mode must be relay or peer')
}
