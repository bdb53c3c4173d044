// Node 20 lacks Promise.withResolvers (added in Node 22), which js-libp2p 3.x
// uses. Load this before anything else: node --import ./polyfill.mjs peer.mjs
Promise.withResolvers ??= () => {
  let resolve, reject
  const promise = new Promise((a, b) => { resolve = a; reject = b })
  return { promise, resolve, reject }
}
