--[[ mark_synced: finish a resync: record the token base for this run, then quarantine (R17, R19).
  KEYS[1] fencegate:synced  KEYS[2] fencegate:quarantine
  ARGV[1] token base  ARGV[2] quarantine (ms, 0 for none)  ARGV[3] the node's run_id
  Returns 1, or 0 when another process (or task) already synced the node in this run:
  then only a larger base is taken (a resync that read a stale marker must not
  quarantine a node that is already serving; a base only rises, so every token
  after it is larger). Resyncs that start a new cluster together thus leave every
  node with the largest base any of them chose: a new name's counters start equal
  on every node, and its first grant needs no round 2 (R4) nor R16's evening.
  The marker is "<base> <run_id>": it vouches for the counters of this
  run of the server only, so a restart (even one that reloads an old snapshot)
  makes every process see the node as unsynced. The quarantine keeps the node
  out of every process's quorums until every lease it may have forgotten expired. ]]
local base = tonumber(ARGV[1])
local marker = redis.call('GET', KEYS[1])
if marker then
  local old = tonumber(string.sub(marker, 1, (string.find(marker, ' ', 1, true) or 0) - 1))
  if string.sub(marker, -#ARGV[3] - 1) == ' ' .. ARGV[3] then
    if old and base > old then
      redis.call('SET', KEYS[1], string.format('%d', base) .. ' ' .. ARGV[3])
    end
    return 0
  end
  if old and old > base then
    base = old
  end
end
redis.call('SET', KEYS[1], string.format('%d', base) .. ' ' .. ARGV[3])
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  redis.call('SET', KEYS[2] .. ':recopy', '1')  -- R21: copy again before granting
end
return 1
