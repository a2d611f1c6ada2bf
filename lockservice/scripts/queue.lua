--[[ queue: helpers shared by acquire.lua, release.lua, undo.lua and state.lua, put in front of each when
  the scripts are loaded (a script cannot call another one).
  A name's waiters live in three keys: waitq:{name} (score: ticket, the waiter's
  arrival time, the same on every node), waitx:{name} (score: the time a waiter
  that does not try again drops out) and waitt:{name} (hash: the ttl in ms the
  waiter asked for, so that a release can hand the lock to it). A member is
  "<lease_id>@<process id>". ]]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The token base when the node was synced in this run of the server and is not
-- quarantined; else nil, and the code an acquire returns (-2 unsynced, -1
-- quarantined) with the quarantine's remaining ms.
-- fencegate:synced is "<token base> <run_id>": it counts only for the run of the
-- server that was synced.
local function grantable(synced_key, quarantine_key, run_id)
  local marker = redis.call('GET', synced_key)
  if not marker then
    return nil, -2, 0
  end
  local sep = string.find(marker, ' ', 1, true)
  if not sep or string.sub(marker, sep + 1) ~= run_id then
    return nil, -2, 0
  end
  local q = redis.call('PTTL', quarantine_key)
  if q > 0 then
    return nil, -1, q
  end
  -- R21: after its quarantine, a resynced node still waits for its counters to be
  -- copied again ("<quarantine key>:recopy", node-global like every fencegate:* key)
  if redis.call('EXISTS', quarantine_key .. ':recopy') == 1 then
    return nil, -1, 0
  end
  return tonumber(string.sub(marker, 1, sep - 1)), 0, 0
end

-- Give the lock to lease_id for ttl ms with the next token. A counter that is
-- missing (first grant of a name, or lost with the node's data) starts above the
-- base, so tokens stay increasing even when every node lost its data. fence:* keys
-- are never deleted. '%d', never tostring: Lua 5.1 prints 14 significant digits.
local function grant(lock_key, fence_key, base, lease_id, ttl)
  local token = redis.call('INCR', fence_key)
  if token <= base then
    token = base + 1
    redis.call('SET', fence_key, string.format('%d', token))
  end
  redis.call('SET', lock_key, lease_id .. ':' .. string.format('%d', token), 'PX', ttl)
  return token
end

-- fence:{name} now (0 when no grant was ever made on this node).
local function counter(fence_key)
  return tonumber(redis.call('GET', fence_key) or '0')
end

local function enqueue(q, x, t, member, ticket, ttl, keepalive, now)
  redis.call('ZADD', q, 'NX', ticket, member)
  redis.call('ZADD', x, now + keepalive, member)
  redis.call('HSET', t, member, ttl)
  -- queues of names nobody asks for again must not stay forever
  redis.call('PEXPIRE', q, 2 * keepalive)
  redis.call('PEXPIRE', x, 2 * keepalive)
  redis.call('PEXPIRE', t, 2 * keepalive)
end

local function dequeue(q, x, t, member)
  local n = redis.call('ZREM', q, member)
  redis.call('ZREM', x, member)
  redis.call('HDEL', t, member)
  return n
end

-- Drop waiters whose keepalive ran out (a crashed process leaves its place behind).
local function purge(q, x, t, now)
  local dead = redis.call('ZRANGEBYSCORE', x, '-inf', now, 'LIMIT', 0, 100)
  if #dead > 0 then
    redis.call('ZREM', x, unpack(dead))
    redis.call('ZREM', q, unpack(dead))
    redis.call('HDEL', t, unpack(dead))
  end
end

-- R9: the lock on this node just became free: grant it to the earliest live waiter,
-- as acquire.lua would (a new token, the ttl it asked for), and publish
-- "<name>\n<released lease>\n<waiter>\n<token>" on "<channel>:<waiter's process>".
-- A node that cannot grant (unsynced, quarantined) publishes the first three lines
-- alone: a wake-up to try. Nobody queued: nothing is published.
local function hand_over(keys, channel, name, released, run_id)
  if redis.call('EXISTS', keys[6]) == 0 then
    return
  end
  purge(keys[5], keys[6], keys[7], now_ms())
  local head = redis.call('ZRANGE', keys[5], 0, 0)[1]
  if not head then
    return
  end
  local at = string.find(head, '@', 1, true)
  if not at then
    return  -- not a member this version queued
  end
  local waiter = string.sub(head, 1, at - 1)
  local message = name .. '\n' .. released .. '\n' .. waiter
  local ttl = redis.call('HGET', keys[7], head)
  local base = ttl and grantable(keys[3], keys[4], run_id)
  if base then
    dequeue(keys[5], keys[6], keys[7], head)
    message = message .. '\n' .. string.format('%d', grant(keys[1], keys[2], base, waiter, ttl))
  end
  redis.call('PUBLISH', channel .. ':' .. string.sub(head, at + 1), message)
end
