#!/usr/bin/env node
// Puts stompit (the npm STOMP client, a client nobody here wrote) under the control of pymq's
// interoperability tests.
//
// One JSON request per line on stdin, exactly one JSON reply per line on stdout, in order.  The protocol
// (ops and fields) is documented in tests/interop/foreign.py, its only caller; the Go driver speaks the
// same one.  Everything goes through stompit's public API (connect, send, subscribe, ack, nack, begin,
// disconnect), so the broker sees what a Node application would send.  stdout carries replies only.
'use strict';

const readline = require('readline');
const stompit = require('stompit');

let client = null;
const subscriptions = new Map(); // id -> stompit Subscription
const inboxes = new Map(); // id -> {messages: [], waiter: fn|null}
const received = new Map(); // message-id -> stompit message (for ACK/NACK)
const transactions = new Map(); // name -> stompit Transaction
const errors = []; // ERROR frames and connection failures, first first
let errorWaiter = null;

function describe(err) {
  const out = {message: err && err.message ? err.message : String(err)};
  if (err && err.longMessage) out.long_message = err.longMessage;
  return out;
}

function recordError(err) {
  errors.push(describe(err));
  if (errorWaiter) {
    const wake = errorWaiter;
    errorWaiter = null;
    wake();
  }
}

function headerPairs(headers) {
  return Object.keys(headers).map((k) => [k, String(headers[k])]);
}

function inbox(id) {
  if (!inboxes.has(id)) inboxes.set(id, {messages: [], waiter: null});
  return inboxes.get(id);
}

// A stompit message is a readable stream; read it whole so the next frame can be parsed.
function readBody(message) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    message.on('data', (chunk) => chunks.push(Buffer.from(chunk)));
    message.on('end', () => resolve(Buffer.concat(chunks)));
    message.on('error', reject);
  });
}

function withTimeout(ms, register) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), ms > 0 ? ms : 5000);
    register((value) => {
      clearTimeout(timer);
      resolve(value);
    });
  });
}

// Frames whose completion we wait for ask stompit for a receipt; an ERROR instead rejects.
function receiptOptions(resolve, reject) {
  return {onReceipt: () => resolve({ok: true, receipted: true}), onError: (err) => reject(err)};
}

function transaction(name) {
  if (!name) return null;
  if (!transactions.has(name)) throw new Error(`driver: no transaction named "${name}" (begin it first)`);
  return transactions.get(name);
}

function sync() {
  // BEGIN then ABORT with a receipt: a RECEIPT confirms every earlier frame (a barrier after SUBSCRIBE)
  return new Promise((resolve, reject) => {
    const tx = client.begin();
    tx.abort(receiptOptions(() => resolve({ok: true}), reject));
  });
}

const ops = {
  // stompit turns an ERROR frame into an Error carrying only the 'message' header
  hello: async () => ({
    ok: true, client: 'stompit', library: 'stompit@' + require('stompit/package.json').version, error_frames: false,
  }),

  connect: (r) => new Promise((resolve) => {
    const connectHeaders = {
      host: '/',
      login: r.login || 'guest',
      passcode: r.passcode || 'guest',
      'heart-beat': '0,0',
      ...(r.version ? {'accept-version': r.version} : {}),
      ...(r.headers || {}),
    };
    stompit.connect({host: r.host || '127.0.0.1', port: r.port, connectHeaders}, (err, c) => {
      if (err) {
        resolve({ok: false, error: describe(err).message, frame: describe(err)});
        return;
      }
      client = c;
      client.on('error', recordError);
      resolve({ok: true, version: client.headers.version || '1.0', headers: headerPairs(client.headers)});
    });
  }),

  send: (r) => new Promise((resolve, reject) => {
    const headers = {...(r.headers || {}), destination: r.destination};
    if (r.content_type) headers['content-type'] = r.content_type;
    const body = Buffer.from(r.body_hex || '', 'hex');
    headers['content-length'] = body.length;
    const tx = transaction(r.transaction);
    const options = r.receipt ? receiptOptions(resolve, reject) : undefined;
    const frame = tx ? tx.send(headers, options) : client.send(headers, options);
    frame.write(body);
    frame.end();
    if (!r.receipt) resolve({ok: true, receipted: false});
  }),

  subscribe: async (r) => {
    const headers = {...(r.headers || {}), destination: r.destination, id: r.id, ack: r.ack || 'auto'};
    const box = inbox(r.id);
    const sub = client.subscribe(headers, (err, message) => {
      if (err) {
        recordError(err);
        return;
      }
      readBody(message).then((body) => {
        const id = message.headers['message-id'];
        if (id !== undefined) received.set(id, message);
        box.messages.push({headers: headerPairs(message.headers), body_hex: body.toString('hex')});
        if (box.waiter) {
          const wake = box.waiter;
          box.waiter = null;
          wake();
        }
      }, recordError);
    });
    subscriptions.set(r.id, sub);
    return {ok: true};
  },

  receive: async (r) => {
    if (!inboxes.has(r.subscription)) return {ok: false, error: `driver: no subscription "${r.subscription}"`};
    const box = inbox(r.subscription);
    if (box.messages.length === 0) {
      await withTimeout(r.timeout_ms, (done) => { box.waiter = () => done(true); });
      box.waiter = null;
    }
    return {ok: true, message: box.messages.length ? box.messages.shift() : null};
  },

  ack: (r) => acknowledge(r, true),
  nack: (r) => acknowledge(r, false),

  begin: async (r) => {
    // stompit lets the caller choose the transaction id; the test's name is used as it is
    transactions.set(r.transaction, client.begin({transaction: r.transaction}));
    return {ok: true, transaction_id: r.transaction};
  },

  commit: (r) => finish(r, true),
  abort: (r) => finish(r, false),
  sync: () => sync(),

  unsubscribe: async (r) => {
    const sub = subscriptions.get(r.id);
    if (!sub) return {ok: false, error: `driver: no subscription "${r.id}"`};
    sub.unsubscribe(r.headers || {});
    subscriptions.delete(r.id);
    return sync();
  },

  error: async (r) => {
    if (errors.length === 0) {
      await withTimeout(r.timeout_ms, (done) => { errorWaiter = () => done(true); });
      errorWaiter = null;
    }
    return {ok: true, error: errors.length ? errors[0] : null};
  },

  disconnect: () => new Promise((resolve, reject) => {
    client.disconnect((err) => (err ? reject(err) : resolve({ok: true})));
  }),
};

function acknowledge(r, positive) {
  return new Promise((resolve, reject) => {
    const message = received.get(r.message_id);
    if (!message) {
      resolve({ok: false, error: `driver: no received message "${r.message_id}"`});
      return;
    }
    const headers = r.transaction ? {transaction: transaction(r.transaction).id} : {};
    const send = positive ? client.ack.bind(client) : client.nack.bind(client);
    send(message, headers, undefined, (err) => (err ? reject(err) : resolve({ok: true})));
  });
}

function finish(r, commit) {
  return new Promise((resolve, reject) => {
    const tx = transaction(r.transaction);
    if (!tx) throw new Error('driver: commit/abort needs a transaction name');
    transactions.delete(r.transaction);
    const options = r.receipt ? receiptOptions(resolve, reject) : undefined;
    if (commit) tx.commit(options); else tx.abort(options);
    if (!r.receipt) resolve({ok: true, receipted: false});
  });
}

async function handle(line) {
  let r;
  try {
    r = JSON.parse(line);
  } catch (err) {
    return {ok: false, error: 'driver: bad request: ' + err.message};
  }
  const op = ops[r.op];
  if (!op) return {ok: false, error: `driver: unknown op "${r.op}"`};
  if (!client && !['connect', 'hello', 'error'].includes(r.op)) return {ok: false, error: 'driver: connect first'};
  try {
    return await op(r);
  } catch (err) {
    const failure = describe(err);
    return {ok: false, error: failure.message, frame: failure};
  }
}

// Requests are handled strictly one after another, in arrival order.
const lines = [];
let busy = false;
let inputEnded = false;

async function drain() {
  if (busy) return;
  busy = true;
  while (lines.length) {
    const reply = await handle(lines.shift());
    process.stdout.write(JSON.stringify(reply) + '\n');
  }
  busy = false;
  if (inputEnded) process.exit(0);
}

const rl = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
rl.on('line', (line) => {
  if (line.trim()) lines.push(line);
  drain();
});
rl.on('close', () => {
  inputEnded = true;
  if (!busy) process.exit(0);
});
