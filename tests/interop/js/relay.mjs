// Circuit relay v2 interop roles for js-libp2p (@libp2p/circuit-relay-v2), beside peer.mjs:
//
//   node --import ./polyfill.mjs relay.mjs relay [--host 127.0.0.1]
//       a js relay server; prints {"id","addrs"} on stdout, serves until SIGTERM (300 s at most)
//   node --import ./polyfill.mjs relay.mjs reserve <relay multiaddr with /p2p/ID>
//       a js peer holding a reservation with that relay; prints {"id","circuit"} (its
//       /p2p-circuit addresses) and serves identify and ping until SIGTERM (300 s at most)
//
// A js relay puts only announced addresses in reservations, so `relay` listens on a chosen
// free port and announces it. Logs go to stderr.
import net from 'node:net'
import process from 'node:process'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { circuitRelayServer, circuitRelayTransport } from '@libp2p/circuit-relay-v2'
import { identify } from '@libp2p/identify'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { createLibp2p } from 'libp2p'

function freePort (host) {
  return new Promise((resolve, reject) => {
    const s = net.createServer()
    s.once('error', reject)
    s.listen(0, host, () => { const p = s.address().port; s.close(() => resolve(p)) })
  })
}

function serveUntilStopped (node) {
  const stop = async () => { await node.stop(); process.exit(0) }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
  setTimeout(stop, 300_000)  // bounded even if nobody stops it
}

const [mode, arg] = process.argv.slice(2)
const host = '127.0.0.1'
const common = {
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  connectionManager: { inboundConnectionThreshold: 1000 }
}

if (mode === 'relay') {
  const port = await freePort(host)
  const addr = `/ip4/${host}/tcp/${port}`
  const node = await createLibp2p({
    ...common,
    addresses: { listen: [addr], announce: [addr] },
    transports: [tcp()],
    services: {
      identify: identify(),
      ping: ping(),
      relay: circuitRelayServer({ reservations: { maxReservations: 15 } })
    }
  })
  node.addEventListener('connection:open', (e) =>
    process.stderr.write(`connection:open ${e.detail.remotePeer} ${e.detail.remoteAddr}\n`))
  process.stdout.write(JSON.stringify({
    id: node.peerId.toString(),
    addrs: node.getMultiaddrs().map((a) => a.toString())
  }) + '\n')
  serveUntilStopped(node)
} else if (mode === 'reserve' && arg) {
  const node = await createLibp2p({
    ...common,
    addresses: { listen: [`/ip4/${host}/tcp/0`, `${arg}/p2p-circuit`] },
    transports: [tcp(), circuitRelayTransport()],
    services: { identify: identify(), ping: ping() }
  })
  const deadline = Date.now() + 30_000
  let circuit = []
  while (Date.now() < deadline) {
    circuit = node.getMultiaddrs().map((a) => a.toString()).filter((a) => a.includes('/p2p-circuit'))
    if (circuit.length > 0) break
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  process.stdout.write(JSON.stringify({ id: node.peerId.toString(), circuit }) + '\n')
  if (circuit.length === 0) { await node.stop(); process.exit(1) }
  serveUntilStopped(node)
} else {
  process.stderr.write('usage: relay.mjs relay | relay.mjs reserve <relay multiaddr/p2p/ID>\n')
  process.exit(2)
}
