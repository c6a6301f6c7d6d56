// KafkaJS transactions against the broker (txn_kafkajs_test.go).
//
//   node kafkajs_txn.js BROKER produce IN OUT GROUP PLAN
//     PLAN is JSON [[from, to, commit], ...] (copyPlan): per step one
//     producer.transaction() that sends copies of IN's records
//     in-p<P>-<i> (i in [from, to)) to the same partition of OUT, commits
//     the position `to` of every partition of IN to GROUP with sendOffsets,
//     and commits or aborts. After each step admin.fetchOffsets must show
//     the position of the last committed step (asked again for up to 5 s).
//     Prints one JSON line per step.
//   node kafkajs_txn.js BROKER read TOPIC PARTITIONS committed|uncommitted
//     A consumer (readUncommitted false or true, a fresh group, from the
//     beginning) reads until it has read the end record end-of-test-p<P> of
//     every partition; prints the records before them as one JSON array of
//     {P, Off, V}.
//
// Exits non-zero with a message on any error or mismatch.
'use strict';
const { Kafka, logLevel } = require('kafkajs');

const [broker, mode, ...args] = process.argv.slice(2);
const kafka = new Kafka({ clientId: 'compat-tests-kafkajs-txn', brokers: [broker], logLevel: logLevel.ERROR, retry: { retries: 8 } });

function fail(msg) {
  console.error('kafkajs_txn: ' + msg);
  process.exit(1);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function produce(input, out, group, plan) {
  const admin = kafka.admin();
  await admin.connect();
  const meta = await admin.fetchTopicMetadata({ topics: [input] });
  const partitions = meta.topics[0].partitions.map((p) => p.partitionId).sort();

  const producer = kafka.producer({
    transactionalId: 'txn-' + out,
    idempotent: true,
    maxInFlightRequests: 1,
    transactionTimeout: 30000,
  });
  await producer.connect();
  let committedAt = -1;
  for (const [i, [from, to, commit]] of plan.entries()) {
    const txn = await producer.transaction();
    const messages = [];
    for (const p of partitions) {
      for (let j = from; j < to; j++) {
        const v = `in-p${p}-${j}`;
        messages.push({ partition: p, key: v, value: v });
      }
    }
    const res = await txn.send({ topic: out, messages, acks: -1 });
    await txn.sendOffsets({
      consumerGroupId: group,
      topics: [{ topic: input, partitions: partitions.map((p) => ({ partition: p, offset: String(to) })) }],
    });
    if (commit) {
      await txn.commit();
      committedAt = to;
    } else {
      await txn.abort();
    }
    // The group's offsets: the last committed step's position.
    let got;
    for (const deadline = Date.now() + 5000; ;) {
      const offs = await admin.fetchOffsets({ groupId: group, topics: [input] });
      got = offs[0].partitions.map((pp) => [pp.partition, Number(pp.offset)]).sort((a, b) => a[0] - b[0]);
      if (got.every(([, o]) => o === committedAt) || Date.now() > deadline) break;
      await sleep(100);
    }
    if (!got.every(([, o]) => o === committedAt) || got.length !== partitions.length) {
      fail(`step ${i} (${from}-${to}, commit=${commit}): group offsets ${JSON.stringify(got)}, want ${committedAt} on each of ${partitions.length} partitions`);
    }
    console.log(JSON.stringify({ step: i, from, to, commit, sent: res.map((r) => ({ p: r.partition, base: r.baseOffset })), groupOffsets: got }));
  }
  await producer.disconnect();
  await admin.disconnect();
}

async function read(topic, partitions, isolation) {
  const consumer = kafka.consumer({
    groupId: `reader-${isolation}-${topic}-${process.pid}`,
    readUncommitted: isolation === 'uncommitted',
    maxWaitTimeInMs: 200,
    sessionTimeout: 10000,
    heartbeatInterval: 1000,
  });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const got = [];
  const done = new Set();
  let resolve;
  const finished = new Promise((r) => { resolve = r; });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      const v = message.value === null ? null : message.value.toString();
      if (done.has(partition)) {
        fail(`read ${isolation}: p${partition} offset ${message.offset} ${JSON.stringify(v)} after the end record`);
      }
      if (v === `end-of-test-p${partition}`) {
        done.add(partition);
        if (done.size === partitions) resolve();
        return;
      }
      got.push({ P: partition, Off: Number(message.offset), V: v });
    },
  });
  const timer = setTimeout(() => fail(`read ${isolation}: end records of ${[...done]} of ${partitions} partitions within 30 s; read ${JSON.stringify(got)}`), 30000);
  await finished;
  clearTimeout(timer);
  await consumer.disconnect();
  console.log(JSON.stringify(got));
}

async function main() {
  switch (mode) {
    case 'produce':
      await produce(args[0], args[1], args[2], JSON.parse(args[3]));
      break;
    case 'read':
      await read(args[0], Number(args[1]), args[2]);
      break;
    default:
      fail(`unknown mode ${mode}`);
  }
}

main().then(() => process.exit(0), (err) => fail(err && err.stack ? err.stack : String(err)));
