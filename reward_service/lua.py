"""The Lua scripts that make every state change of a task atomic (see keys.py for the key layout).

Invariant kept by every script: `pending` equals the number of queue items held in all `queue:*` and `proc:*`
lists. A result is written once, so a task scored twice (at-least-once delivery after a worker was presumed dead)
still has one result, and the second finish only removes its item; the one exception is FINISH replacing a value
the worker found unsigned (signing.py: a forged result), named exactly in its arguments. Results arrive signed:
the scripts never see the key. Time is Redis' own clock
(`TIME`), so instances and workers on different hosts agree. Scripts build some key names from the prefix, which
is fine on one Redis server (Redis Cluster is not supported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

_NOW = """
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

ENQUEUE = (
    _NOW
    + """
-- KEYS: task, blob, rid, pending
-- ARGV: uuid, header, n, max_pending, ttl, digest ('' = no request id), prefix, rewards (JSON list), wake_cap,
--       signature (signing.task_signature of header and npy)
-- The pixels are already stored under KEYS[2] (a plain SET with the TTL, sent just before this script on the same
-- connection: a large value costs several times more as a script argument); a refused request deletes them, and
-- a request whose pixels are not there (that SET failed) is refused with 'lost'.
local prefix = ARGV[7]
if ARGV[6] ~= '' then
  local existing = redis.call('GET', KEYS[3])
  if existing then
    redis.call('DEL', KEYS[2])
    return {'dup', existing}
  end
end
local names = cjson.decode(ARGV[8])
local pending = tonumber(redis.call('GET', KEYS[4]) or '0')
if pending + #names > tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[2])
  return {'full', tostring(pending)}
end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'lost', ''} end
local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'header', ARGV[2], 'created', string.format('%.6f', now()), 'n', ARGV[3],
           'rewards', ARGV[8], 'remaining', #names, 'sig', ARGV[10])
redis.call('EXPIRE', KEYS[1], ttl)
for _, name in ipairs(names) do
  redis.call('HSET', KEYS[1], 's:' .. name, 'queued')
  redis.call('LPUSH', prefix .. 'queue:' .. name, name .. '|' .. ARGV[1] .. '|' .. ARGV[3])
  redis.call('LPUSH', prefix .. 'wake:' .. name, ARGV[1])
  redis.call('LTRIM', prefix .. 'wake:' .. name, 0, tonumber(ARGV[9]))
end
redis.call('INCRBY', KEYS[4], #names)
if ARGV[6] ~= '' then redis.call('SET', KEYS[3], ARGV[1] .. '|' .. ARGV[6], 'EX', ttl) end
return {'ok', ARGV[1]}
"""
)

CLAIM = (
    _NOW
    + """
-- KEYS: queue, proc    ARGV: image budget, max items, prefix, reward
-- Moves items from the queue's consumer end to the processing list while their image counts fit the budget
-- (the first item always moves: one large request is still scored, the reward batches it internally), and
-- returns what scoring them needs but the pixels (the worker reads those beside the claim or with one MGET: a
-- large value costs several times more as a script's answer):
--   {now, {item, header, created, attempts, stored result, signature}, ...}   (false where a key is gone)
local budget, limit, prefix, name = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local out, taken, total = {string.format('%.6f', now())}, 0, 0
while taken < limit do
  local item = redis.call('LINDEX', KEYS[1], -1)
  if not item then break end
  local n = tonumber(string.match(item, '|(%d+)$'))
  if taken > 0 and total + n > budget then break end
  redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  taken, total = taken + 1, total + n
  local uuid = string.match(item, '^[^|]+|([^|]+)|')
  local fields = redis.call('HMGET', prefix .. 'task:' .. uuid, 'header', 'created', 'a:' .. name, 'sig')
  local done = redis.call('GET', prefix .. 'result:' .. uuid .. ':' .. name)
  out[#out + 1] = {item, fields[1], fields[2], fields[3], done, fields[4]}
end
if taken == 0 then return {} end
return out
"""
)

FINISH = (
    _NOW
    + """
-- KEYS: proc, result, task, blob, pending, latency
-- ARGV: item, signed result ('' = only drop the item), ttl, status, channel, message, reward, score seconds,
--       replace (the exact stored value this result may replace: one the worker found failing its signature check)
-- Returns 1 when the result was stored, 0 when there was nothing to store (a dropped item, an expired task), -1
-- when another value is stored there (a duplicate scoring, or a forged value the worker then checks).
-- Publishes "<uuid>|<reward>\\n<result>": waiting pulls answer from the message without reading Redis again.
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if removed > 0 then redis.call('DECRBY', KEYS[5], removed) end
if ARGV[2] == '' or redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
local current = redis.call('GET', KEYS[2])
if current and current ~= ARGV[9] then return -1 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[3]))
local previous = redis.call('HGET', KEYS[3], 's:' .. ARGV[7])
redis.call('HSET', KEYS[3], 's:' .. ARGV[7], ARGV[4])
if previous ~= 'done' and previous ~= 'failed' then
  if redis.call('HINCRBY', KEYS[3], 'remaining', -1) <= 0 then redis.call('DEL', KEYS[4]) end
end
local created = tonumber(redis.call('HGET', KEYS[3], 'created'))
redis.call('LPUSH', KEYS[6], string.format('%.6f,%s', now() - created, ARGV[8]))
redis.call('LTRIM', KEYS[6], 0, 255)
redis.call('PUBLISH', ARGV[5], ARGV[6] .. '\\n' .. ARGV[2])
return 1
"""
)

REAP = """
-- KEYS: proc, heartbeat, workers, pending
-- ARGV: worker id, prefix, max attempts, result ttl, channel, wake cap, failures (JSON {item: signed failure})
-- Hands the items of a dead worker (no heartbeat) back to their queues; a task whose workers died max attempts
-- times fails instead, with the failure the caller signed for its item (requeued when the caller had none: it
-- fails at the next reap). Returns the number requeued, -1 when the worker is alive.
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local prefix, max_attempts = ARGV[2], tonumber(ARGV[3])
local failures = cjson.decode(ARGV[7])
local requeued = 0
for _, item in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local name, uuid = string.match(item, '^([^|]+)|([^|]+)|')
  local task = prefix .. 'task:' .. uuid
  if redis.call('EXISTS', task) == 0 then
    redis.call('DECR', KEYS[4])
  else
    local attempts = redis.call('HINCRBY', task, 'a:' .. name, 1)
    local msg = failures[item]
    if attempts >= max_attempts and msg then
      if redis.call('SET', prefix .. 'result:' .. uuid .. ':' .. name, msg, 'NX', 'EX', tonumber(ARGV[4])) then
        redis.call('HSET', task, 's:' .. name, 'failed')
        if redis.call('HINCRBY', task, 'remaining', -1) <= 0 then redis.call('DEL', prefix .. 'blob:' .. uuid) end
        redis.call('PUBLISH', ARGV[5], uuid .. '|' .. name)
      end
      redis.call('DECR', KEYS[4])
    else
      redis.call('RPUSH', prefix .. 'queue:' .. name, item)
      redis.call('LPUSH', prefix .. 'wake:' .. name, '1')
      redis.call('LTRIM', prefix .. 'wake:' .. name, 0, tonumber(ARGV[6]))
      requeued = requeued + 1
    end
  end
end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return requeued
"""

FAIL_TASK = """
-- KEYS: task, result, queue, pending, blob
-- ARGV: item, signed result, ttl, reward, channel, message
-- Fails a task that is still queued or running (deadline passed); a worker still holding it only drops it later.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'EX', tonumber(ARGV[3])) then return 0 end
local removed = redis.call('LREM', KEYS[3], 0, ARGV[1])
if removed > 0 then redis.call('DECRBY', KEYS[4], removed) end
redis.call('HSET', KEYS[1], 's:' .. ARGV[4], 'failed')
if redis.call('HINCRBY', KEYS[1], 'remaining', -1) <= 0 then redis.call('DEL', KEYS[5]) end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"""


@dataclass
class Scripts:
    """The scripts registered on one client (sync `redis.Redis` or `redis.asyncio.Redis`)."""

    enqueue: Any
    claim: Any
    finish: Any
    reap: Any
    fail_task: Any

    @classmethod
    def register(cls, client: Any) -> Scripts:
        """Register every script on `client` (loaded lazily by EVALSHA, reloaded after a Redis restart)."""
        return cls(*(client.register_script(src) for src in (ENQUEUE, CLAIM, FINISH, REAP, FAIL_TASK)))

    def all(self) -> tuple[Any, ...]:
        """Every registered script."""
        return (self.enqueue, self.claim, self.finish, self.reap, self.fail_task)


def queue_script(pipe: Any, script: Any, keys: list[Any], args: list[Any]) -> None:
    """Queue `script` on `pipe` as a bare EVALSHA. redis-py's own way (`script(keys, args, client=pipe)`) asks
    Redis `SCRIPT EXISTS` before every such pipeline, one more round trip; `execute` / `aexecute` instead load
    the scripts and send the pipeline again when Redis answers that it lost them (a restart)."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


def execute(client: Any, scripts: Scripts, build: Callable[[Any], None]) -> list[Any]:
    """Build a pipeline of `client` (sync) with `build(pipe)` and send it; after NoScriptError the scripts are
    loaded and it is built and sent once more, so every pipeline sent this way must be safe to send twice."""
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        build(pipe)
        try:
            return pipe.execute()
        except NoScriptError:
            if attempt:
                raise
            for script in scripts.all():
                client.script_load(script.script)
    raise AssertionError("unreachable")


async def aexecute(client: Any, scripts: Scripts, build: Callable[[Any], None]) -> list[Any]:
    """`execute` for a `redis.asyncio.Redis` client."""
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        build(pipe)
        try:
            return await pipe.execute()
        except NoScriptError:
            if attempt:
                raise
            for script in scripts.all():
                await client.script_load(script.script)
    raise AssertionError("unreachable")
