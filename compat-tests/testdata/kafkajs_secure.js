// KafkaJS against a secure listener, driven by security_kafkajs_test.go,
// which decides what is right: this script only drives the client and
// prints, as its last line, RESULT followed by a JSON object:
//
//   {"ok": true, "consumed": [...]}
//   {"ok": false, "error": {"name", "type", "code", "message"}, "causes": [...]}
//
// causes: the error's cause chain (KafkaJS wraps protocol errors in
// retry errors), each {name, type, code, message}.
//
//   node kafkajs_secure.js CONFIG_JSON
//
// CONFIG_JSON: {"brokers": [...], "ca": PEM file or null (no TLS), "cert"
// and "key": a client certificate (mTLS) or null, "sasl": {mechanism,
// username, password} or null, "action": ACTION, "topic", "group", "values"}
//
// ACTION: roundtrip (produce values, read them back as a member of group,
// commit), produce, group (join group for topic: fails or times out),
// connect (admin connect: authenticates).
'use strict';
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');

const cfg = JSON.parse(process.argv[2]);
const TIMEOUT = 20000;

const kafka = new Kafka({
  clientId: 'compat-tests-kafkajs-secure',
  brokers: cfg.brokers,
  ssl: cfg.ca ? Object.assign({ ca: [fs.readFileSync(cfg.ca, 'utf8')] },
    cfg.cert ? { cert: fs.readFileSync(cfg.cert, 'utf8'), key: fs.readFileSync(cfg.key, 'utf8') } : {}) : false,
  sasl: cfg.sasl || undefined,
  logLevel: logLevel.NOTHING,
  connectionTimeout: 5000,
  requestTimeout: 10000,
  retry: { retries: 2, initialRetryTime: 100, maxRetryTime: 1000 },
});

function describe(e) {
  return { name: e.name, type: e.type, code: e.code, message: e.message };
}

function withTimeout(p, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: timed out after ${TIMEOUT} ms`)), TIMEOUT);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

async function produce() {
  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  try {
    await producer.send({
      topic: cfg.topic, acks: -1,
      messages: cfg.values.map((v, i) => ({ key: `k${i}`, value: v, partition: 0 })),
    });
  } finally {
    await producer.disconnect();
  }
}

// consumeGroup reads n records of cfg.topic as a member of cfg.group and
// commits them; a consumer crash (a non-retriable error) rejects.
async function consumeGroup(n) {
  const consumer = kafka.consumer({ groupId: cfg.group, sessionTimeout: 10000, heartbeatInterval: 1000, maxWaitTimeInMs: 250,
    retry: { retries: 1, initialRetryTime: 100, maxRetryTime: 500 } });
  const got = [];
  let resolve, reject;
  const done = new Promise((res, rej) => { resolve = res; reject = rej; });
  consumer.on(consumer.events.CRASH, ({ payload }) => reject(payload.error));
  await consumer.connect();
  try {
    await consumer.subscribe({ topic: cfg.topic, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        got.push(message.value.toString());
        if (got.length === n) {
          await consumer.commitOffsets([{ topic: cfg.topic, partition, offset: String(Number(message.offset) + 1) }]);
          resolve();
        }
      },
    });
    await withTimeout(done, 'consume');
  } finally {
    await consumer.disconnect();
  }
  return got;
}

async function main() {
  const result = { ok: true };
  try {
    switch (cfg.action) {
      case 'roundtrip':
        await produce();
        result.consumed = await consumeGroup(cfg.values.length);
        break;
      case 'produce':
        await produce();
        break;
      case 'group':
        result.consumed = await consumeGroup(1);
        break;
      case 'connect': {
        const admin = kafka.admin();
        await withTimeout(admin.connect(), 'connect');
        await admin.disconnect();
        break;
      }
      default:
        throw new Error(`unknown action ${cfg.action}`);
    }
  } catch (e) {
    result.ok = false;
    result.error = describe(e);
    result.causes = [];
    for (let c = e.cause || e.originalError; c && result.causes.length < 10; c = c.cause || c.originalError) {
      result.causes.push(describe(c));
    }
  }
  console.log('RESULT ' + JSON.stringify(result));
}

main().then(() => process.exit(0), (e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
