-- wrk script for scripts/bench: replays pre-signed, unique events from a file,
-- counts status codes, optionally paces each connection, prints one JSON line.
-- The file has one request per line: "<timestamp>\t<signature>\t<body>".
local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local path, nthreads = args[1], tonumber(args[2])
  pace_ms = tonumber(args[3] or "0")
  requests_ = {}
  local i = 0
  for line in io.lines(path) do
    if i % nthreads == id then
      local ts, sig, body = line:match("^([^\t]+)\t([^\t]+)\t(.*)$")
      requests_[#requests_ + 1] = wrk.format("POST", "/webhooks/events", {
        ["Content-Type"] = "application/json",
        ["X-Webhook-Timestamp"] = ts,
        ["X-Webhook-Signature"] = sig,
      }, body)
    end
    i = i + 1
  end
  next_ = 0
  statuses = {}
  exhausted = 0
end

function request()
  next_ = next_ + 1
  if next_ > #requests_ then
    exhausted = exhausted + 1
    next_ = 1  -- reused events come back as duplicates (200) and fail the run
  end
  return requests_[next_]
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

if os.getenv("BENCH_PACE") then
  function delay()
    return pace_ms
  end
end

function done(summary, latency, requests)
  local merged, exhausted_total = {}, 0
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      merged[status] = (merged[status] or 0) + n
    end
    exhausted_total = exhausted_total + thread:get("exhausted")
  end
  local parts = {}
  for status, n in pairs(merged) do
    parts[#parts + 1] = string.format('"%d":%d', status, n)
  end
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"errors":{"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d},"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d,' ..
    '"statuses":{%s},"exhausted":%d}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
    table.concat(parts, ","), exhausted_total))
end
