// BullMQ's side of the benchmark's wait scenario (bench/waits.py runs it):
//   node wait.mjs worker URL QUEUE         a Worker (default options) whose
//                                          handler returns 1; prints "ready"
//   node wait.mjs serve URL QUEUE          one queue.add -> job.waitUntilFinished round
//                                          trip per "go" line on stdin, its ms printed
//                                          (bench/waits.py takes them in turn with ours)
//   node wait.mjs waiters URL QUEUE N      adds N jobs, waits on all of them at
//                                          once (one QueueEvents), prints
//                                          "waiting", then, once all finished,
//                                          {"delay_ms": [...]}: each wake (Date.now())
//                                          minus its job's finishedOn (ms)
import { Queue, QueueEvents, Worker, Job } from "bullmq";

const [mode, url, queueName, n] = process.argv.slice(2);
const u = new URL(url);
const connection = { host: u.hostname, port: Number(u.port || 6379) };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

if (mode === "worker") {
  const worker = new Worker(queueName, async () => 1, { connection });
  await worker.waitUntilReady();
  console.log("ready");
  process.on("SIGTERM", async () => {
    await worker.close();
    process.exit(0);
  });
} else if (mode === "serve") {
  // one round trip per "go" line on stdin, its ms printed; anything else ends it
  const queue = new Queue(queueName, { connection });
  const events = new QueueEvents(queueName, { connection });
  await events.waitUntilReady();
  const once = async () => {
    const t0 = performance.now();
    const job = await queue.add("w", {});
    await job.waitUntilFinished(events, 10000);
    return performance.now() - t0;
  };
  console.log("ready");
  const { createInterface } = await import("node:readline");
  for await (const line of createInterface({ input: process.stdin })) {
    if (line.trim() !== "go") break;
    console.log(String(await once()));
  }
  process.exit(0);
} else if (mode === "waiters") {
  const queue = new Queue(queueName, { connection });
  const events = new QueueEvents(queueName, { connection });
  await events.waitUntilReady();
  const jobs = await queue.addBulk(Array.from({ length: Number(n) }, () => ({ name: "w", data: {} })));
  const woke = {};
  const all = jobs.map((job) =>
    job.waitUntilFinished(events, 120000).then(() => {
      woke[job.id] = Date.now();
    }),
  );
  console.log("waiting");
  await Promise.all(all);
  const delay_ms = [];
  for (const job of jobs) {
    const done = await Job.fromId(queue, job.id);
    delay_ms.push(woke[job.id] - done.finishedOn);
  }
  console.log(JSON.stringify({ delay_ms }));
  await events.close();
  await queue.close();
}
