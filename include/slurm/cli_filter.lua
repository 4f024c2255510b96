--[[
  gpu-cost: right-sizing advice at submission, a Slurm cli_filter/lua script.

  At sbatch, salloc and srun (not for job steps) it looks up the submitting user, and the job's
  class (the job name with numbers and hashes stripped, as the agent does), in the advice file
  that the GPU Cost Agent's nightly run writes (`gpu-cost rightsize write`), and prints the advice
  on stderr when the job asks for more GPUs, or a longer --time, than that history needed. The job
  is submitted as asked. Only when the site's policy says so (rightsize.block) is a request for
  far more GPUs than advised refused.

  It never breaks a submission: no advice file, an unreadable or malformed one, an unknown user or
  any error of its own, and it says nothing and lets the job through. `sbatch --quiet` silences
  the advice (not a refusal).

  Install (Slurm 22.05 or later; docs/rightsizing.md): put this file beside slurm.conf on every
  host users submit from, as cli_filter.lua, and add to slurm.conf there:

      CliFilterPlugins=cli_filter/lua

  Set the policy's rightsize.advice_file to the file below (default: gpu-cost-advice.tsv beside
  slurm.conf), or copy the nightly's file there. cli_filter runs in the user's own process, so a
  user can get around it: `block` is a guard rail, not enforcement.

  Checked against Slurm 22.05 (Lua 5.1): options are strings (nil when unset), options["type"]
  is sbatch / salloc / srun, options["argv"] a table, slurm.time_str2mins parses --time.
]]

-- The advice file; nil: gpu-cost-advice.tsv in the folder of slurm.conf ($SLURM_CONF, else /etc/slurm).
local ADVICE_FILE = nil
-- How the submitting uid becomes a user name (NSS: LDAP and sssd users too).
local ID_COMMAND = "/usr/bin/id"

local MAGIC = "# gpu-cost rightsize advice v1"
local COLUMNS = 12  -- scope user stem ask_min gpus_advice block_above time_ask_min_s time_advice_s head gpus_text time_text block_text

local function advice_path()
  if ADVICE_FILE then
    return ADVICE_FILE
  end
  local conf = os.getenv("SLURM_CONF") or "/etc/slurm/slurm.conf"
  return (string.match(conf, "^(.*)/[^/]*$") or ".") .. "/gpu-cost-advice.tsv"
end

-- gpu_cost.analyse.baselines.name_stem: lower case, split at - _ . / : @ + and spaces; a token of digits,
-- or of 4+ hex characters with a digit, becomes "#"; other digit runs become "#".
local function stem_token(p)
  if string.find(p, "^%d+$") or (#p >= 4 and string.find(p, "^[0-9a-f]+$") and string.find(p, "%d")) then
    return "#"
  end
  return (string.gsub(p, "%d+", "#"))
end

local function name_stem(name)
  name = string.lower(name or "")
  local out, pos = {}, 1
  while pos <= #name do
    local s, e = string.find(name, "[%-_%./:@%+ ]+", pos)
    if not s then
      out[#out + 1] = stem_token(string.sub(name, pos))
      break
    end
    if s > pos then
      out[#out + 1] = stem_token(string.sub(name, pos, s - 1))
    end
    out[#out + 1] = string.sub(name, s, e)
    pos = e + 1
  end
  return table.concat(out)
end

local function first_number(text, default)
  return tonumber(string.match(text or "", "^%s*(%d+)")) or default
end

-- "[type:]count[,...]" (--gpus, --gpus-per-node, --gpus-per-task): the counts summed.
local function count_list(spec)
  local n = 0
  for part in string.gmatch(spec or "", "[^,]+") do
    part = string.gsub(part, "%b()", "")
    n = n + (tonumber(string.match(part, "(%d+)%s*$")) or 0)
  end
  return n
end

-- --gres: "gres:gpu[:type][:count]" entries (per node); a gpu entry without a count is one GPU.
local function count_gres(spec)
  local n = 0
  for part in string.gmatch(spec or "", "[^,]+") do
    part = string.gsub(string.gsub(part, "%b()", ""), "^gres:", "")
    if string.find(part, "^gpu") and (part == "gpu" or string.sub(part, 4, 4) == ":") then
      n = n + (tonumber(string.match(part, ":(%d+)%s*$")) or 1)
    end
  end
  return n
end

local function gpus_asked(options)
  local nodes = first_number(options["nodes"], 1)
  local tasks = first_number(options["ntasks"], 1)
  return math.max(count_list(options["gpus"]), count_list(options["gpus-per-node"]) * nodes,
                  count_gres(options["gres"]) * nodes, count_list(options["gpus-per-task"]) * tasks)
end

-- seconds of --time; nil when none was asked (the partition's default applies) or UNLIMITED
local function time_asked(options)
  local t = options["time"]
  if not t or not slurm.time_str2mins then
    return nil
  end
  local ok, mins = pcall(slurm.time_str2mins, t)
  if ok and type(mins) == "number" and mins > 0 and mins < 2147483647 then
    return mins * 60
  end
  return nil
end

local function user_name(options)
  local uid = options["uid"]
  if uid and string.find(uid, "^%d+$") then
    local p = io.popen(ID_COMMAND .. " -nu " .. uid .. " 2>/dev/null")
    if p then
      local name = p:read("*l")
      p:close()
      if name and name ~= "" then
        return name
      end
    end
  end
  return os.getenv("USER") or os.getenv("LOGNAME")
end

local function job_name(options)
  if options["job-name"] then
    return options["job-name"]
  end
  local argv = options["argv"]
  if type(argv) == "table" and argv[1] then
    return string.match(argv[1], "([^/]*)$")
  end
  if options["wrap"] then
    return "wrap"
  end
  return ""
end

local function split_tabs(line)
  local out, pos = {}, 1
  while true do
    local i = string.find(line, "\t", pos, true)
    if not i then
      out[#out + 1] = string.sub(line, pos)
      return out
    end
    out[#out + 1] = string.sub(line, pos, i - 1)
    pos = i + 1
  end
end

-- the row for this user's class, else for the user; nil when the file has none (or is not ours)
local function find_advice(path, user, stem)
  local fh = io.open(path, "r")
  if not fh then
    return nil
  end
  local first = fh:read("*l")
  if not first or string.sub(first, 1, #MAGIC) ~= MAGIC then
    fh:close()
    return nil
  end
  local class_key = "class\t" .. user .. "\t" .. stem .. "\t"
  local user_key = "user\t" .. user .. "\t\t"
  local class_row, user_row
  for line in fh:lines() do
    local is_class = stem ~= "" and string.sub(line, 1, #class_key) == class_key
    if is_class or string.sub(line, 1, #user_key) == user_key then
      local f = split_tabs(line)
      if #f == COLUMNS then
        local row = {ask_min = tonumber(f[4]) or 0, gpus_advice = tonumber(f[5]) or 0, block_above = tonumber(f[6]) or 0,
                     time_ask_min = tonumber(f[7]) or 0, time_advice = tonumber(f[8]) or 0,
                     head = f[9], gpus_text = f[10], time_text = f[11], block_text = f[12]}
        if is_class then
          class_row = row
        else
          user_row = row
        end
      end
    end
  end
  fh:close()
  return class_row or user_row
end

local function pre_submit(options)
  local prog = options["type"] or "sbatch"
  if prog == "srun" and os.getenv("SLURM_JOB_ID") then
    return slurm.SUCCESS  -- a step of a job already running: it was advised when it was submitted
  end
  local gpus = gpus_asked(options)
  if gpus <= 0 then
    return slurm.SUCCESS
  end
  local user = user_name(options)
  if not user or user == "" then
    return slurm.SUCCESS
  end
  local row = find_advice(advice_path(), user, name_stem(job_name(options)))
  if not row then
    return slurm.SUCCESS
  end
  if row.block_above > 0 and gpus > row.block_above and row.block_text ~= "" then
    io.stderr:write(prog .. ": error: gpu-cost: " .. row.block_text .. "\n")
    return slurm.ERROR
  end
  local lines = {}
  if row.gpus_advice > 0 and gpus >= row.ask_min and row.gpus_text ~= "" then
    lines[#lines + 1] = row.gpus_text
  end
  local t = time_asked(options)
  if row.time_advice > 0 and (t == nil or t >= row.time_ask_min) and row.time_text ~= "" then
    lines[#lines + 1] = row.time_text
  end
  local quiet = options["quiet"]
  if #lines == 0 or (quiet and quiet ~= "0" and quiet ~= "") then
    return slurm.SUCCESS
  end
  local out = {prog .. ": gpu-cost: " .. row.head}
  for _, line in ipairs(lines) do
    out[#out + 1] = prog .. ": gpu-cost:   " .. line
  end
  out[#out + 1] = prog .. ": gpu-cost: advice only: the job is submitted as asked."
  io.stderr:write(table.concat(out, "\n") .. "\n")
  return slurm.SUCCESS
end

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  local ok, rc = pcall(pre_submit, options)
  if ok then
    return rc
  end
  if slurm.log_debug then
    pcall(slurm.log_debug, "gpu-cost: no advice: %s", tostring(rc))
  end
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, job_id, step_id)
  return slurm.SUCCESS
end
