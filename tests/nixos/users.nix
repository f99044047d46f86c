# Reduced `users.users` and `users.groups` (nixos/modules/config/users-groups.nix): the options a
# service's static user touches, with their types and defaults, what isNormalUser implies, and the
# assertions NixOS makes about them.
{ config, lib, ... }:
let
  inherit (lib) mkDefault mkOption types;
  cfg = config.users;
  nameRegex = "[a-zA-Z0-9_.][a-zA-Z0-9_.-]*";

  userOpts =
    { name, config, ... }:
    {
      options = {
        enable = mkOption {
          type = types.bool;
          default = true;
          description = "Whether the account is created.";
        };
        name = mkOption {
          type = types.passwdEntry types.str;
          apply =
            x:
            assert (
              builtins.stringLength x < 32
              || abort "Username '${x}' is longer than 31 characters which is not allowed!"
            );
            x;
          description = "Account name (the attribute name by default).";
        };
        uid = mkOption {
          type = types.nullOr types.int;
          default = null;
          description = "UID; null: picked on activation.";
        };
        isSystemUser = mkOption {
          type = types.bool;
          default = false;
          description = "UID from the system range. Exactly one of isNormalUser and isSystemUser.";
        };
        isNormalUser = mkOption {
          type = types.bool;
          default = false;
          description = "A real user: group users, a home, the default shell.";
        };
        group = mkOption {
          type = types.str;
          apply =
            x:
            assert (
              builtins.stringLength x < 32
              || abort "Group name '${x}' is longer than 31 characters which is not allowed!"
            );
            x;
          default = "";
          description = "Primary group.";
        };
        extraGroups = mkOption {
          type = types.listOf types.str;
          default = [ ];
          description = "Auxiliary groups.";
        };
        home = mkOption {
          type = types.passwdEntry types.path;
          default = "/var/empty";
          description = "Home directory.";
        };
        createHome = mkOption {
          type = types.bool;
          default = false;
          description = "Create the home directory.";
        };
        description = mkOption {
          type = types.passwdEntry types.str;
          default = "";
          description = "GECOS field.";
        };
      };
      config = lib.mkMerge [
        { name = mkDefault name; }
        (lib.mkIf config.isNormalUser {
          group = mkDefault "users";
          createHome = mkDefault true;
          home = mkDefault "/home/${config.name}";
          isSystemUser = mkDefault false;
        })
      ];
    };

  groupOpts =
    { name, ... }:
    {
      options = {
        name = mkOption {
          type = types.passwdEntry types.str;
          description = "Group name (the attribute name by default).";
        };
        gid = mkOption {
          type = types.nullOr types.int;
          default = null;
          description = "GID; null: picked on activation.";
        };
        members = mkOption {
          type = types.listOf (types.passwdEntry types.str);
          default = [ ];
          description = "Member user names.";
        };
      };
      config.name = mkDefault name;
    };

  groupNames = lib.mapAttrsToList (_: g: g.name) cfg.groups;
  usersWithoutExistingGroup = lib.filterAttrs (
    _: u: u.group != "" && !lib.elem u.group groupNames
  ) cfg.users;
in
{
  options.users = {
    users = mkOption {
      type = types.attrsOf (types.submodule userOpts);
      default = { };
      description = "User accounts.";
    };
    groups = mkOption {
      type = types.attrsOf (types.submodule groupOpts);
      default = { };
      description = "Groups.";
    };
  };

  config = {
    users.users.root = {
      uid = 0;
      home = "/root";
      group = "root";
    };
    users.groups = {
      root.gid = 0;
      users.gid = 100;
      nogroup.gid = 65534;
    };
    assertions = [
      {
        assertion = usersWithoutExistingGroup == { };
        message = "The following users have a primary group that is undefined: ${toString (lib.attrNames usersWithoutExistingGroup)}";
      }
    ]
    ++ lib.concatLists (
      lib.mapAttrsToList (_: user: [
        {
          assertion = builtins.match nameRegex user.name != null;
          message = "The username \"${user.name}\" is not valid, it does not match the regex \"${nameRegex}\".";
        }
        {
          assertion = user.isNormalUser && user.uid != null -> user.uid >= 1000;
          message = "A user cannot have a users.users.${user.name}.uid set below 1000 and set users.users.${user.name}.isNormalUser.";
        }
        {
          assertion =
            let
              isEffectivelySystemUser =
                user.isSystemUser || (user.uid != null && user.uid < 1000 && !user.isNormalUser);
            in
            lib.xor isEffectivelySystemUser user.isNormalUser;
          message = "Exactly one of users.users.${user.name}.isSystemUser and users.users.${user.name}.isNormalUser must be set.";
        }
        {
          assertion = user.group != "";
          message = "users.users.${user.name}.group is unset.";
        }
      ]) cfg.users
    );
  };
}
