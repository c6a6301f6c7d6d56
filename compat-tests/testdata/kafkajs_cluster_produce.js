// Produce through a leader's kill: node kafkajs_cluster_produce.js BOOTSTRAP TOPIC N
//
// N records "v-<i>" to partition i % 3, one every 10 ms, idempotent,
// acks=all, each awaited; every acknowledgement printed as
// "ACK <partition> <offset> <value>". Run by cluster_clients_test.go, which
// kills a leader while this runs and reads everything back.
'use strict';
const { Kafka, logLevel } = require('kafkajs');

const [broker, topic, nArg] = process.argv.slice(2);
const n = parseInt(nArg, 10);
const kafka = new Kafka({ clientId: 'compat-tests-kafkajs-cluster', brokers: [broker], logLevel: logLevel.NOTHING,
  retry: { retries: 30, initialRetryTime: 100, maxRetryTime: 1000 } });

(async () => {
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, metadataMaxAge: 1000 });
  await producer.connect();
  for (let i = 0; i < n; i++) {
    const v = `v-${i}`;
    const res = await producer.send({ topic, acks: -1, timeout: 10000, messages: [{ value: v, partition: i % 3 }] });
    for (const r of res) {
      console.log(`ACK ${r.partition} ${r.baseOffset} ${v}`);
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  await producer.disconnect();
})().catch((e) => {
  console.error('kafkajs: ' + e);
  process.exit(1);
});
